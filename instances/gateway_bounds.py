"""The most input one Messages request forwarded by the gateway can be billed, or why it has no such bound.

The gateway (`instances.gateway`) reserves each call's worst case before forwarding it. Text (the
request's JSON, tool definitions, tool results, thinking) is bounded by its bytes: every token
covers at least one byte. Media is billed by what it shows, not by its size, so each kind has a
stated bound instead, and its base64 payload is not also counted as text:

- an image: `IMAGE_TOKENS`. The provider scales every image down to its model's limit before
  counting it: at most 4,784 visual tokens (2,576 px on the long edge) on the high-resolution
  tier, about 1,600 on earlier models. 5,000 covers the largest tier and the block's own overhead.
- a PDF: `PAGE_TOKENS` per page: each page is billed as its extracted text (documented as
  typically 1,500 to 3,000 tokens) plus an image of the page. 6,000 for the text (twice the
  documented top) plus `IMAGE_TOKENS`. Pages are counted in the PDF's own bytes (`pdf_pages`);
  a PDF whose pages cannot be counted is refused.
- tools: `TOOL_USE_TOKENS` once when a request defines tools (the provider's tool-use system
  prompt, documented at up to 530 tokens), and `ANTHROPIC_TOOL_TOKENS` for each Anthropic-defined
  client tool (documented at up to 735 tokens, plus up to 499 for the computer-use prompt).

What the provider bills apart from tokens, prices differently, fetches or runs itself, or reads
from storage the gateway cannot see is refused with `Unbounded`, whose message names the field or
type. Pure: reads only the request.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from typing import Any

IMAGE_TOKENS = 5_000
PAGE_TOKENS = 6_000 + IMAGE_TOKENS
TOOL_USE_TOKENS = 1_000
ANTHROPIC_TOOL_TOKENS = 2_000
MAX_INFLATED_BYTES = 64 << 20  # the most a PDF's object streams may decompress to while pages are counted
MAX_HEADER_BYTES = 64 << 10  # how far before a stream its dictionary is looked for

# Anthropic-defined tools the agent's own program executes (billed as tokens only); every other
# typed tool runs on Anthropic's side (web search, web fetch, code execution): billed apart from
# tokens and a way out to the network that the sandbox does not give the act.
CLIENT_TOOL_PREFIXES = ("bash_", "text_editor_", "computer_", "memory_")
# Content blocks whose tokens the bound covers; any other is refused.
BLOCKS = frozenset(
    {"text", "image", "document", "search_result", "tool_use", "tool_result", "thinking", "redacted_thinking"}
)
# Request fields that change the price from the rates Tether holds: the values that keep those rates.
PRICED = {
    "service_tier": (None, "auto", "standard_only"),
    "speed": (None, "standard"),
    "inference_geo": (None, "global"),
}


class Unbounded(ValueError):
    """A request the gateway cannot bound; the message names the field or type and why."""


def input_tokens(body: dict[str, Any], headers: dict[str, str], size: int) -> int:
    """Return the most input tokens the Messages request `body` (`size` bytes as sent) can be billed.

    Raises Unbounded for anything the bound does not cover.
    """
    _check_fields(body, headers)
    tokens = size + _tools(body.get("tools"))
    messages = body.get("messages")
    pending: list[Any] = [body.get("system")]
    if isinstance(messages, list):
        pending += [m.get("content") for m in messages if isinstance(m, dict)]
    while pending:
        content = pending.pop()
        if not isinstance(content, list):
            continue  # a string is text; anything else the provider refuses, unbilled
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind not in BLOCKS:
                raise Unbounded(f"content block type {kind!r}: the gateway bounds only {', '.join(sorted(BLOCKS))}")
            _check_cache(block)
            citations = block.get("citations")
            if isinstance(citations, dict) and citations.get("enabled"):
                raise Unbounded(f"{kind} citations: the provider's chunking adds input the gateway cannot bound")
            if kind in ("image", "document"):
                tokens += _media(kind, block.get("source"), pending)
            pending.append(block.get("content"))
    return tokens


def _check_fields(body: dict[str, Any], headers: dict[str, str]) -> None:
    if body.get("mcp_servers"):
        raise Unbounded("mcp_servers: MCP connectors run on the provider's side and are neither metered nor sandboxed")
    if body.get("container") is not None:
        raise Unbounded("container: code-execution containers run on the provider's side, billed apart from tokens")
    for field, priced in PRICED.items():
        if body.get(field) not in priced:
            allowed = " or ".join(repr(value) for value in priced if value)
            raise Unbounded(f"{field} {body.get(field)!r}: only {allowed} is priced")
    managed = body.get("context_management")
    edits = managed.get("edits") if isinstance(managed, dict) else None
    kinds = [str(e.get("type", "")) for e in edits if isinstance(e, dict)] if isinstance(edits, list) else []
    if body.get("compaction") is not None or any(kind.startswith("compact") for kind in kinds):
        raise Unbounded("compaction: its summarizing call is billed apart from the usage the gateway settles")
    _check_cache(body)
    if "context-1m" in headers.get("anthropic-beta", ""):
        raise Unbounded("anthropic-beta context-1m: long-context rates are not priced")


def _check_cache(item: dict[str, Any]) -> None:
    cache = item.get("cache_control")
    if isinstance(cache, dict) and cache.get("ttl") not in (None, "5m"):
        raise Unbounded(f"cache_control ttl {cache.get('ttl')!r}: only the 5-minute cache is priced")


def _tools(tools: Any) -> int:
    if not isinstance(tools, list) or not tools:
        return 0
    tokens = TOOL_USE_TOKENS
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        _check_cache(tool)
        kind = tool.get("type")
        if kind is None or kind == "custom":
            continue
        if not isinstance(kind, str) or not kind.startswith(CLIENT_TOOL_PREFIXES):
            raise Unbounded(f"tools: {kind!r} is a server tool, billed apart from tokens and run outside the sandbox")
        tokens += ANTHROPIC_TOOL_TOKENS
    return tokens


def _media(kind: str, source: Any, pending: list[Any]) -> int:
    """Return what an image or document adds to the bound beyond its bytes (its payload is not text)."""
    if not isinstance(source, dict):
        raise Unbounded(f"{kind} block without a source object: the gateway cannot bound it")
    how = source.get("type")
    if how == "url":
        raise Unbounded(f"{kind} source url: the provider would fetch it, unmetered, from outside the sandbox")
    if how == "file":
        raise Unbounded(f"{kind} source file_id: the provider reads a stored file the gateway cannot see or bound")
    if kind == "document" and how == "text":
        return 0  # plain text: its bytes bound it
    if kind == "document" and how == "content":
        pending.append(source.get("content"))
        return 0
    if how != "base64" or not isinstance(source.get("data"), str):
        raise Unbounded(f"{kind} source type {how!r}: the gateway bounds base64 sources only")
    data = source["data"]
    payload = len(data.encode("utf-8", "surrogatepass"))
    if kind == "image":
        return IMAGE_TOKENS - payload
    if source.get("media_type") != "application/pdf":
        raise Unbounded(f"document media_type {source.get('media_type')!r}: the gateway bounds application/pdf only")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise Unbounded("document (application/pdf): its data is not base64, so its pages cannot be counted") from None
    return pdf_pages(raw) * PAGE_TOKENS - payload


# --- counting a PDF's pages ---------------------------------------------------------------

_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")  # a name's #xx escape: /Ty#70e is /Type
_GAP = rb"\s*+"  # between two tokens (possessive: every pattern here runs in linear time)
_END = rb"(?![^\s()<>\[\]{}/%])"  # the name ends here (/Page, not /Pages)
_PAGE = re.compile(rb"/Type" + _GAP + rb"/Page" + _END)
_KIDS = re.compile(rb"/Kids" + _END + _GAP + rb"(\[[^\[\]]*\])?")
_REF = re.compile(rb"(?<!\d)\d+\s+\d+\s+R" + _END)
_COMMENTED = re.compile(rb"/(?:Type|Kids|Filter)" + _GAP + rb"%")  # a comment where a value belongs
_STREAM = re.compile(rb"(?<!end)stream\r?\n")
_OBJSTM = re.compile(rb"/Type" + _GAP + rb"/ObjStm" + _END + rb"|/First" + _END)
_FLATE = re.compile(rb"/Filter" + _GAP + rb"(?:/FlateDecode|\[" + _GAP + rb"/FlateDecode" + _GAP + rb"\])" + _END)


def pdf_pages(pdf: bytes) -> int:
    """Return how many pages the PDF `pdf` can have, counted high; raise Unbounded when they cannot be counted.

    Reads the file and its compressed object streams (where page objects may live), with name
    escapes undone, and takes the larger of two counts: the page objects (`/Type /Page`) and the
    references in the page tree's `/Kids` arrays (every page is one; intermediate nodes and older
    revisions only add to it).
    """
    if not pdf.startswith(b"%PDF-"):
        raise Unbounded("document (application/pdf): its data is not a PDF, so its pages cannot be counted")
    text = b"\n".join([_unescape(pdf), *_object_streams(pdf)])
    if b"/Encrypt" in text:
        raise Unbounded("document (application/pdf): it is encrypted, so its pages cannot be counted")
    if _COMMENTED.search(text):
        raise Unbounded("document (application/pdf): a comment stands inside its objects; pages uncountable")
    kids = 0
    for found in _KIDS.finditer(text):
        if found[1] is None:
            raise Unbounded("document (application/pdf): its page tree's /Kids is not a plain array; pages uncountable")
        kids += len(_REF.findall(found[1]))
    pages = max(len(_PAGE.findall(text)), kids)
    if pages < 1:
        raise Unbounded("document (application/pdf): no pages could be counted in it")
    return pages


def _unescape(text: bytes) -> bytes:
    return _ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), text)


def _object_streams(pdf: bytes) -> list[bytes]:
    """Return the decompressed contents of the PDF's object streams (the file itself holds the rest)."""
    found: list[bytes] = []
    left = MAX_INFLATED_BYTES
    at = 0
    while keyword := _STREAM.search(pdf, at):
        floor = max(at, keyword.start() - MAX_HEADER_BYTES)  # its dictionary: after the stream before it
        header = _unescape(pdf[max(pdf.rfind(b"obj", floor, keyword.start()), floor) : keyword.start()])
        end = pdf.find(b"endstream", keyword.end())
        at = len(pdf) if end < 0 else end
        if not _OBJSTM.search(header) or b"/Filter" not in header:
            continue  # not an object stream, or one stored plain (read with the file)
        if not _FLATE.search(header) or b"/DecodeParms" in header:
            raise Unbounded("document (application/pdf): an object stream uses a filter the gateway does not read")
        inflate = zlib.decompressobj()
        try:  # read to the compressed data's own end, whatever bytes it holds
            content = inflate.decompress(memoryview(pdf)[keyword.end() :], left + 1)
        except zlib.error:
            raise Unbounded("document (application/pdf): an object stream is corrupt; its pages cannot be counted") from None
        at = max(at, len(pdf) - len(inflate.unused_data) - len(inflate.unconsumed_tail))  # past what it held
        left -= len(content)
        if left < 0:
            raise Unbounded(f"document (application/pdf): its object streams expand past {MAX_INFLATED_BYTES} bytes")
        found.append(_unescape(content))
    return found
