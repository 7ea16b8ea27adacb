"""The gateway's reservation bounds every call it forwards; what it cannot bound it refuses by name.

A provider bills media by what it shows, not by its bytes: an image or a PDF page costs thousands
of input tokens in a request of a few hundred bytes. The local Messages server plays such a
provider, billing the documented worst case for each kind of content, and every forwarded call
must settle within its reservation. The agent is the real `anthropic` SDK over the worker's
socket, as in test_gateway.
"""

import base64
import json
import socket
import threading
import zlib

import anthropic
import httpx2
import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client

from budgets.models import Reservation
from instances import capabilities, gateway
from instances.models import Credential
from loops import services
from tests.fakes.messages_server import MessagesServer, text
from tests.loops.conftest import Background

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-GATEWAYBOUNDSKEY-0123456789abcdefLMNO"
LIVE = """
pathlib.Path("token.txt").write_text(os.environ["ANTHROPIC_API_KEY"])
while not pathlib.Path("release").exists():
    time.sleep(0.05)
"""
# The provider's documented per-unit bills: an image on the high-resolution tier, a PDF page (its
# text at the documented top of 1,500-3,000 tokens, plus the page as an image), and the tool-use
# system prompt plus the computer-use tool's own definition and prompt.
IMAGE = 4_784
PAGE = 3_000 + IMAGE
COMPUTER_TOOL = 530 + 735 + 499
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


@pytest.fixture(autouse=True)
def no_ambient_keys(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.fixture
def live(user, make_instance, server, script, price):
    """Start a run whose act waits; yield a function returning its gateway token (for `base_url`)."""
    started = []

    def open_act(base_url=None):
        credential = Credential.create_for(user, label="mine", secret=KEY)
        inst = make_instance(
            user, brain="command", decider="checks", base_url=base_url or server.url, credential=credential,
            model="claude-test-1", command=script(LIVE), checks=[], max_iterations=1,
        )
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        run = services.run_start(instance=inst, user=user, objective="work", max_cost_usd="1.00")
        started.append((inst, Background(run).start()))
        token = inst.workspace_path() / "token.txt"
        for _ in range(400):
            if token.exists() and token.read_text():
                return token.read_text(), run
            threading.Event().wait(0.05)
        run.refresh_from_db()
        raise AssertionError(f"the act never started: {run.status} {run.outcome_detail}")

    yield open_act
    for inst, driver in started:
        (inst.workspace_path() / "release").write_text("")
        driver.join(30)


def sdk(token):
    """The real SDK, on the worker's gateway socket."""
    http = httpx2.Client(transport=httpx2.HTTPTransport(uds=gateway.serve()))
    return anthropic.Anthropic(api_key=token, base_url="http://gateway", http_client=http, max_retries=0)


def ask(token, content, **extra):
    return sdk(token).messages.create(
        model="claude-test-1", max_tokens=100, messages=[{"role": "user", "content": content}], extra_body=extra
    )


def bill(server, input_tokens):
    """Make the provider bill `input_tokens` of input (and all the output it may) for every call."""
    server.responder = lambda body: text("seen", usage={"input_tokens": input_tokens, "output_tokens": body["max_tokens"]})


def pdf(pages, *, packed=False, disguised=False):
    """Return a PDF of `pages` blank pages (bytes).

    `packed`: the pages live in a compressed object stream. `disguised`: the leaves carry no
    /Type, the tree's names are written with #xx escapes, and its /Count says 1.
    """
    leaf = b"<< /Parent 2 0 R /MediaBox [0 0 612 792] >>" if disguised else b"<< /Type /Page /Parent 2 0 R >>"
    kids = b" ".join(b"%d 0 R" % (3 + n) for n in range(pages))
    tree = b"/Ty#70e\n/Pag#65s" if disguised else b"/Type /Pages"
    count = b"%d" % (1 if disguised else pages)
    objects = {1: b"<< /Type /Catalog /Pages 2 0 R >>", 2: b"<< " + tree + b" /Kids [" + kids + b"] /Count " + count + b" >>"}
    if packed:
        offsets = b" ".join(b"%d 0" % (3 + n) for n in range(pages)) + b" "
        data = zlib.compress(offsets + b" ".join([leaf] * pages))
        head = b"<< /Type /ObjStm /N %d /First %d /Filter /FlateDecode /Length %d >>" % (pages, len(offsets), len(data))
        objects[3 + pages] = head + b"\nstream\n" + data + b"\nendstream"
    else:
        objects.update({3 + n: leaf for n in range(pages)})
    body = b"".join(b"%d 0 obj\n%s\nendobj\n" % (number, value) for number, value in objects.items())
    return b"%PDF-1.7\n" + body + b"trailer\n<< /Root 1 0 R >>\n%%EOF\n"


def document(data, **extra):
    source = {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(data).decode()}
    return {"type": "document", "source": source, **extra}


IMAGE_BLOCK = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}

# (content, extra request fields, input tokens the provider bills)
FORWARDED = {
    "image": ([IMAGE_BLOCK, {"type": "text", "text": "what is it?"}], {}, IMAGE),
    "two images": ([IMAGE_BLOCK, IMAGE_BLOCK], {}, 2 * IMAGE),
    "pdf": ([document(pdf(2))], {}, 2 * PAGE),
    "pdf in an object stream": ([document(pdf(3, packed=True))], {}, 3 * PAGE),
    "pdf with a disguised page tree": ([document(pdf(3, packed=True, disguised=True))], {}, 3 * PAGE),
    "image in a tool result": (
        [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [IMAGE_BLOCK]}], {}, IMAGE,
    ),
    "image in a document's content": (
        [{"type": "document", "source": {"type": "content", "content": [IMAGE_BLOCK]}}], {}, IMAGE,
    ),
    "plain-text document": (
        [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x" * 400}}], {}, 400,
    ),
    "computer-use tool": (
        "look", {"tools": [{"type": "computer_20250124", "name": "computer", "display_width_px": 1024,
                            "display_height_px": 768}]}, COMPUTER_TOOL,
    ),
}


@pytest.mark.parametrize("kind", FORWARDED)
def test_a_provider_billing_the_documented_worst_case_never_overdraws_a_reservation(live, server, kind):
    content, extra, billed = FORWARDED[kind]
    if kind == "image in a tool result":  # a tool result answers the model's own call
        server.enqueue(text("calling", usage={"output_tokens": 5}) | {
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}], "stop_reason": "tool_use"})
    token, run = live()
    if kind == "image in a tool result":
        tools = [{"name": "look", "input_schema": {"type": "object"}}]
        first = ask(token, "look", tools=tools)
        called = [{"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} for b in first.content]
        turns = [{"role": "user", "content": "look"}, {"role": "assistant", "content": called},
                 {"role": "user", "content": content}]
        bill(server, billed)
        sdk(token).messages.create(model="claude-test-1", max_tokens=100, messages=turns, extra_body={"tools": tools})
    else:
        bill(server, billed)
        ask(token, content, **extra)
    call = Reservation.objects.filter(run_id=run.pk, call__gt=0).order_by("call").last()
    assert call.usage["input_tokens"] == billed
    assert call.overdraft == 0 and call.actual <= call.amount, (kind, call.actual, call.amount)


def pdf_source(data):
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}


ENCRYPTED = pdf(1).replace(b"trailer\n<< ", b"trailer\n<< /Encrypt 9 0 R ")
LZW = pdf(2, packed=True).replace(b"/FlateDecode", b"/LZWDecode")
# (content, extra request fields, what the refusal names)
REFUSED = {
    "image by url": ([{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}], {}, "url"),
    "pdf by url": ([{"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}], {}, "url"),
    "image by file_id": ([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}], {}, "file_id"),
    "pdf by file_id": ([{"type": "document", "source": {"type": "file", "file_id": "file_1"}}], {}, "file_id"),
    "container upload": ([{"type": "container_upload", "file_id": "file_1"}], {}, "container_upload"),
    "container": ("hi", {"container": "container_1"}, "container"),
    "code execution": ("hi", {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}, "server tool"),
    "priority tier": ("hi", {"service_tier": "priority"}, "service_tier"),
    "fast mode": ("hi", {"speed": "fast"}, "speed"),
    "us-only inference": ("hi", {"inference_geo": "us"}, "inference_geo"),
    "compaction": ("hi", {"context_management": {"edits": [{"type": "compact_20260112"}]}}, "compaction"),
    "citations": ([document(pdf(1), citations={"enabled": True})], {}, "citations"),
    "pdf without pages": ([document(b"%PDF-1.7\n%%EOF\n")], {}, "no pages"),
    "not a pdf": ([document(b"GIF89a....")], {}, "not a PDF"),
    "pdf not base64": ([pdf_source("not base64!")], {}, "base64"),
    "encrypted pdf": ([document(ENCRYPTED)], {}, "encrypted"),
    "pdf packed with another filter": ([document(LZW)], {}, "filter"),
    "pdf with a comment in its page tree": ([document(pdf(2).replace(b"/Kids [", b"/Kids %x\n["))], {}, "comment"),
    "pdf with an indirect page tree": ([document(pdf(2).replace(b"/Kids [", b"/Kids 7 0 R /X ["))], {}, "/Kids"),
}


@pytest.mark.parametrize("kind", REFUSED)
def test_what_cannot_be_bounded_is_refused_with_a_400_naming_it(live, server, kind):
    content, extra, named = REFUSED[kind]
    bill(server, 10)
    token, _ = live()
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(token, content, **extra)
    assert refused.value.status_code == 400
    assert named.lower() in refused.value.body["error"]["message"].lower(), refused.value.body
    assert refused.value.response.headers["content-type"] == "application/json"
    assert server.calls == 0


def test_count_tokens_has_the_size_cap_and_the_refusals_of_messages(live, server):
    token, _ = live()
    big = gateway.handle("POST", "/v1/messages/count_tokens", {"x-api-key": token}, b" " * (gateway.MAX_BODY_BYTES + 1))
    assert big.status == 413 and big.headers["content-type"] == "application/json"
    assert str(gateway.MAX_BODY_BYTES) in json.loads(big.body)["error"]["message"]
    url_image = [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk(token).messages.count_tokens(model="claude-test-1", messages=[{"role": "user", "content": url_image}])
    assert "url" in refused.value.body["error"]["message"]
    assert server.calls == 0
    assert sdk(token).messages.count_tokens(model="claude-test-1", messages=[{"role": "user", "content": "hi"}]).input_tokens
    assert server.calls == 1


@pytest.fixture
def resolver(monkeypatch):
    """Make `model.example` resolve to the addresses in `answers` (one list per lookup, the last repeating)."""
    real = socket.getaddrinfo
    state = {"answers": [["93.184.216.34"]], "lookups": 0}

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "model.example":
            return real(host, port, *args, **kwargs)
        answers = state["answers"]
        addresses = answers[min(state["lookups"], len(answers) - 1)]
        state["lookups"] += 1
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, port)) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return state


def test_a_base_url_that_rebinds_to_a_refused_address_is_not_connected_to(live, server, resolver, settings):
    settings.TETHER_ALLOW_PRIVATE_BASE_URLS = False
    url = f"http://model.example:{server.url.rsplit(':', 1)[1]}"
    assert capabilities.check_base_url(url) == url  # saved while the name resolved to a public address
    resolver["answers"] = [["127.0.0.1"]]  # then rebound to this machine, where the provider listens
    resolver["lookups"] = 0
    bill(server, 10)
    token, _ = live(base_url=url)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        ask(token, "hi")
    message = refused.value.body["error"]["message"]
    assert "base_url" in message and "model.example" in message and "127.0.0.1" in message
    with pytest.raises(anthropic.PermissionDeniedError):
        sdk(token).messages.count_tokens(model="claude-test-1", messages=[{"role": "user", "content": "hi"}])
    assert server.calls == 0


def test_a_base_url_host_is_resolved_once_and_the_checked_address_is_the_one_connected_to(live, server, resolver, settings):
    settings.TETHER_ALLOW_PRIVATE_BASE_URLS = True  # an operator's local model gateway, named
    port = server.url.rsplit(":", 1)[1]
    resolver["answers"] = [["127.0.0.1"], ["192.0.2.1"]]  # a second lookup would go elsewhere
    bill(server, 10)
    token, _ = live(base_url=f"http://model.example:{port}")
    resolver["lookups"] = 0
    assert ask(token, "hi").content[0].text == "seen"
    assert resolver["lookups"] == 1
    assert server.requests[-1].headers["host"] == f"model.example:{port}"


def test_a_multipart_body_without_a_boundary_is_a_json_400(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    secret = _get_new_csrf_string()
    client.cookies["csrftoken"] = secret
    answer = client.post("/v1/instances", data=b"x", content_type="multipart/form-data", HTTP_X_CSRFTOKEN=secret)
    assert answer.status_code == 400
    assert answer["content-type"] == "application/json"
    assert "boundary" in answer.json()["error"]
