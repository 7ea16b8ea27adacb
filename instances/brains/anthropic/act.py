"""`AnthropicBrain`: one bounded tool-use exchange with Claude (see the package docstring)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from instances import sandbox
from instances.brains.anthropic.config import CACHE, model_for
from instances.brains.anthropic.messages import (
    brief_input,
    call_signature,
    texts,
    with_cache_marker,
)
from instances.brains.anthropic.session import Session, Stopped, TimedOut
from instances.brains.base import (
    ActRequest,
    BrainError,
    DelegateRefused,
    JournaledTurn,
    JournalError,
    Reply,
    check_delegate,
)
from instances.brains.text import clip, render_checks
from instances.pinned import Pinned
from instances.tools import ToolContext, ToolResult, definitions, run_tool
from instances.tools.mcp import McpTools, is_mcp_name
from tether import tracing
from tether.storable import storable

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are an autonomous agent run by Tether. Each turn of the loop you receive an instruction; "
    "work toward the objective with the tools you have, inside your workspace, then reply with a "
    "short account of what you did and what remains."
)
INTERRUPTED = (
    "interrupted: a previous attempt of this act started this call and was cut off before it finished; "
    "its effect is unknown — check before repeating it"
)


class AnthropicBrain:
    """Claude acting with tools in the instance's workspace (see the package docstring)."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance

    def unmetered_reserve(self) -> int:
        return 0  # every model call reserves its own worst case just before it goes out (budgets.metering)

    def act(self, request: ActRequest) -> Reply:
        session = Session(
            self.instance,
            stop=request.stop,
            deadline=time.monotonic() + max(float(request.timeout), 1.0),
            model=model_for(self.instance),
            meter=request.meter,
        )
        try:
            return _Act(self.instance, request, session).run()
        finally:
            session.close()


class _Act:
    def __init__(self, instance: Any, request: ActRequest, session: Session) -> None:
        self.instance = instance
        self.request = request
        self.session = session
        self.limits = session.limits
        self.texts: list[str] = []
        self.executed: list[dict[str, Any]] = []
        self.enabled = list(instance.tools or [])
        self.journal = request.journal
        self.replayed: dict[int, JournaledTurn] = {}  # what an earlier attempt of this iteration journaled
        self.mcp = McpTools(instance, workspace=request.workspace, stop=request.stop, secrets=session.secrets)
        self.pinned: Pinned | None = None
        # The act's `delegate` calls vetted and accepted so far: their children start when the act ends.
        self.delegations: list[dict[str, Any]] = []
        self.refused: dict[str, str] = {}  # this turn's refused `delegate` calls: id -> why
        self.approved = {
            call_signature(c["name"], c.get("input", {}))
            for c in getattr(request, "approved_calls", None) or []
            if isinstance(c, Mapping) and "name" in c
        }

    def run(self) -> Reply:
        try:
            return self._run()
        except BrainError as exc:  # e.g. the budget ended the act: what it said and ran so far is kept
            if not exc.text and not exc.tool_calls:
                kept = self._reply(False, exc.detail, delegations=False)
                exc.text, exc.tool_calls = kept.text, kept.tool_calls
            raise
        finally:
            self.mcp.close()
            if self.pinned is not None:
                self.pinned.close()

    def _run(self) -> Reply:
        prepared = self._prepare()
        if isinstance(prepared, Reply):
            return prepared
        context, tools = prepared
        try:
            return self._converse(context, tools)
        except Stopped:
            detail = "stopped during the act"
            if self.session.abandoned:
                detail += "; the model call in flight was abandoned and its input counted as an estimate"
            return self._reply(False, detail, stopped=True)
        except TimedOut:
            return self._reply(False, f"the act passed its {self.request.timeout:g}s time limit", timed_out=True)
        except JournalError as exc:  # a call that cannot be journaled is not run
            return self._reply(False, str(exc))

    def _prepare(self) -> tuple[ToolContext, list[dict[str, Any]]] | Reply:
        """Pin the workspace, connect the MCP servers and list the act's tools; or the reply saying why not."""
        instance, request = self.instance, self.request
        request.workspace.mkdir(parents=True, exist_ok=True)
        # The file tools work through the workspace held open from here: what is swapped on its
        # path during the act changes nothing they reach.
        try:
            self.pinned = Pinned(sandbox.checked_workspace(request.workspace))
        except (sandbox.WorkspaceRefused, OSError) as exc:
            return self._reply(False, f"the workspace cannot be opened: {exc}")
        # The MCP servers the agent may use: connected for this act, their secrets redacted like its keys.
        self.mcp.open()
        self.session.secrets = self.mcp.secrets
        for server, why in self.mcp.failures:
            self.executed.append(
                {"name": f"mcp__{server}", "input": {}, "is_error": True, "result": clip(f"could not connect: {why}", 300)}
            )
        context = ToolContext(
            workspace=request.workspace,
            timeout=float(instance.tool_timeout_seconds),
            output_cap=int(settings.TETHER_OUTPUT_CAP_BYTES),
            command_allow=tuple(instance.command_allow or ()),
            command_deny=tuple(instance.command_deny or ()),
            stop=request.stop,
            secrets=self.session.secrets,
            instance_id=instance.pk,
            network=bool(getattr(instance, "network", False)),
            pinned=self.pinned,
        )
        try:
            return context, definitions(self.enabled) + self.mcp.definitions()
        except ValueError as exc:
            return self._reply(False, f"the instance's tools are misconfigured: {exc}")

    def _system(self) -> list[dict[str, Any]]:
        # Breakpoints: tools + system prompt (shared by every run of the instance), + the
        # objective (shared by every iteration of the run), + the act's latest turn.
        return [
            {"type": "text", "text": self.instance.system_prompt or DEFAULT_SYSTEM_PROMPT, "cache_control": CACHE},
            {
                "type": "text",
                "text": f"The objective of this run:\n{self.request.objective}\n\n"
                "Your workspace is the current directory of every tool; give paths relative to it.",
                "cache_control": CACHE,
            },
        ]

    def _converse(self, context: ToolContext, tools: list[dict[str, Any]]) -> Reply:
        """The opening, then model turns and their tool calls, until the model or a bound ends the act."""
        instance = self.instance
        system = self._system()
        if self.journal is not None:
            self.replayed = self.journal.replay()
        messages: list[dict[str, Any]] = [{"role": "user", "content": self._opening(context)}]
        if approved_delegations := self._approved_delegations():
            return approved_delegations  # a person approved them: the loop starts the children now
        turns = 0
        while True:
            room = int(instance.max_output_tokens) - self.session.usage.output_tokens
            if room <= 0:
                return self._reply(True, f"the act used its {instance.max_output_tokens} output tokens")
            content, stop_reason = self._answer(turns + 1, room, system, tools, messages)
            messages.append({"role": "assistant", "content": content})
            if said := texts(content):
                self.texts.append(said)
            calls = [b for b in content if b.get("type") == "tool_use"]
            if ended := self._ended(turns, stop_reason, calls):
                return ended
            if parked := self._needing_approval(calls):
                return parked
            if delegating := self._delegating(turns + 1, content, calls, context):
                return delegating
            messages.append({"role": "user", "content": self._run_tools(turns + 1, content, calls, context)})
            turns += 1

    def _answer(
        self, turn: int, room: int, system: list[dict[str, Any]], tools: list[dict[str, Any]], messages: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]:
        """The model's answer to the conversation so far (its content blocks and stop reason)."""
        kept = self.replayed.get(turn)
        if kept is not None and kept.content is not None:
            # An earlier attempt was given this answer and journaled its calls: not asked again.
            return kept.content, "tool_use"
        params: dict[str, Any] = {
            "model": self.session.usage.model,
            "max_tokens": min(room, self.limits.max_tokens_per_call),
            "system": system,
            "messages": with_cache_marker(messages),
        }
        if tools:
            params["tools"] = tools
            params["tool_choice"] = {"type": "auto"}
        body = self.session.create(params)
        return body.get("content") or [], str(body.get("stop_reason"))

    def _ended(self, turns: int, stop_reason: str, calls: list[dict[str, Any]]) -> Reply | None:
        """The reply ending the act after the model's answer, or None when its tool calls are to run."""
        if stop_reason == "refusal":
            return self._reply(False, "the model declined to continue (refusal)")
        if stop_reason == "max_tokens":
            return self._reply(True, "the model reached the output token limit mid-answer")
        if stop_reason != "tool_use" or not calls:
            return self._reply(True, "")
        if turns >= int(self.instance.max_tool_turns):
            return self._reply(True, f"the act stopped at its limit of {self.instance.max_tool_turns} tool turns")
        return None

    def _opening(self, context: ToolContext) -> list[dict[str, Any]]:
        request = self.request
        blocks: list[dict[str, Any]] = []
        if history := request.history:
            blocks.append({"type": "text", "text": history})
        if checks := render_checks(request.checks):
            blocks.append({"type": "text", "text": checks})
        if self.mcp.notes:
            blocks.append({"type": "text", "text": self.session.scrub("\n".join(self.mcp.notes))})
        ran = []
        for index, call in enumerate(getattr(request, "approved_calls", None) or []):
            if not isinstance(call, Mapping) or "name" not in call or call["name"] == "delegate":
                continue  # (an approved delegate call is the loop's to start: `_approved_delegations`)
            result = self._journaled_call(0, index, call, None, context)
            state = "failed" if result.is_error else "ran"
            ran.append(f"- {call_signature(str(call['name']), call.get('input', {}))} {state}:\n{clip(result.content, 4000)}")
        if ran:
            blocks.append({"type": "text", "text": "A person approved the calls you proposed; they were run:\n" + "\n".join(ran)})
        blocks.append({"type": "text", "text": f"Iteration {request.iteration}. Instruction:\n{request.instruction}"})
        return blocks

    def _needing_approval(self, calls: list[dict[str, Any]]) -> Reply | None:
        gated = {n for n in self.instance.approval_tools or () if not is_mcp_name(n)}  # MCP tools: self.mcp says
        pending = [
            c for c in calls
            if (c.get("name") in gated or self.mcp.needs_approval(str(c.get("name"))))
            and call_signature(c["name"], c.get("input", {})) not in self.approved
        ]
        if not pending:
            return None
        shown = "; ".join(self.session.scrub(clip(call_signature(c["name"], c.get("input", {})), 500)) for c in pending)
        reply = self._reply(False, f"needs approval: {shown}")
        reply.tool_calls = [
            {"name": c["name"], "input": c.get("input", {}), "id": c.get("id", ""), "needs_approval": True}
            for c in pending
        ]
        return reply

    def _approved_delegations(self) -> Reply | None:
        """End the act with the `delegate` calls a person approved, for the loop to start (never run here)."""
        approved = [
            c for c in getattr(self.request, "approved_calls", None) or []
            if isinstance(c, Mapping) and c.get("name") == "delegate" and "delegate" in self.enabled
        ]
        if not approved:
            return None
        reply = self._reply(True, f"a person approved {len(approved)} delegation(s); waiting for them")
        reply.tool_calls = [
            *reply.tool_calls,
            *({"name": "delegate", "input": c.get("input", {}), "id": c.get("id", ""), "delegate": True}
              for c in approved),
        ]
        return reply

    def _delegating(
        self, turn: int, content: list[dict[str, Any]], calls: list[dict[str, Any]], context: ToolContext
    ) -> Reply | None:
        """Vet the turn's `delegate` calls at once; end the act for the loop to start them if all were accepted.

        The turn's other calls run first. When one is refused (bounds, arguments, fit, reach), nothing
        ends: every call of the turn gets its tool_result now — the refusal for that call, "accepted"
        for the others — and the act goes on; what was accepted starts when the act ends.
        """
        if "delegate" not in self.enabled:
            return None
        delegated = [c for c in calls if c.get("name") == "delegate"]
        if not delegated:
            return None
        self.refused = {}
        for call in delegated:
            try:
                kept = check_delegate(self.request.run_id, call.get("input", {}), list(self.delegations))
            except DelegateRefused as exc:
                self.refused[str(call.get("id", ""))] = str(exc)
            else:
                self.delegations.append({"name": "delegate", "input": kept, "id": call.get("id", ""), "delegate": True})
        if self.refused:
            return None  # `_run_tools` answers every call of the turn, the refusals included
        self._run_tools(turn, content, calls, context, skipping="delegate")
        return self._reply(True, f"delegated {len(self.delegations)} sub-objective(s); waiting for them")

    def _run_tools(
        self,
        turn: int,
        content: list[dict[str, Any]],
        calls: list[dict[str, Any]],
        context: ToolContext,
        *,
        skipping: str = "",
    ) -> list[dict[str, Any]]:
        """Run the turn's calls in order (but those named `skipping`); return their tool_result blocks."""
        results = []
        for index, call in enumerate(calls):
            if call.get("name") == skipping:
                continue
            if self.request.stop.is_set():
                raise Stopped
            if time.monotonic() >= self.session.deadline:
                raise TimedOut
            if call.get("name") == "delegate" and "delegate" in self.enabled:
                result = self._delegate_result(call)
            else:
                result = self._journaled_call(turn, index, call, content, context)
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": call["id"],
                "content": result.content or "(no output)",
            }
            if result.is_error:
                block["is_error"] = True
            results.append(block)
        return results

    def _delegate_result(self, call: Mapping[str, Any]) -> ToolResult:
        """The tool_result of a `delegate` call `_delegating` vetted: its refusal, or that it is accepted."""
        why = self.refused.get(str(call.get("id", "")))
        if why is not None:
            result = ToolResult(f"refused, and no run was made: {why}", True)
            self._record(call, result)
            return result
        return ToolResult(
            "accepted: the child run starts when you end this turn (answer without calling a tool); your run then "
            "waits for it, and its outcome comes in your next instruction",
            False,
        )

    def _journaled_call(
        self,
        turn: int,
        index: int,
        call: Mapping[str, Any],
        content: list[dict[str, Any]] | None,
        context: ToolContext,
    ) -> ToolResult:
        """Run one call under the journal (when the act has one) and record it in the reply.

        A call an earlier attempt finished gives its journaled result again; one it started and
        never finished is reported as interrupted; any other is journaled, run, then journaled
        with its result.
        """
        name, arguments = str(call.get("name")), call.get("input", {})
        if self.journal is None:
            result = self._call_tool(name, arguments, context)
            self._record(call, result)
            return result
        kept = self.replayed.get(turn)
        done = kept.calls.get(index) if kept is not None else None
        if done is not None:
            result = ToolResult(done.result, done.is_error) if done.finished else ToolResult(INTERRUPTED, True)
            self._record(call, result, key=done.key, replayed="result" if done.finished else "interrupted")
            return result
        key = self.journal.started(turn, index, {"id": call.get("id", ""), "name": name, "input": arguments}, content)
        with tracing.span(f"execute_tool {name}", gen_ai__operation__name="execute_tool", gen_ai__tool__name=name) as traced:
            result = self._call_tool(name, arguments, context)
            traced.set(tether__tool__is_error=bool(result.is_error))
        self.journal.finished(key, self.session.scrub(result.content), result.is_error)
        self._record(call, result, key=key)
        return result

    def _call_tool(self, name: str, arguments: Any, context: ToolContext) -> ToolResult:
        """Run one call: an MCP server's tool through its connection, a built-in tool if enabled."""
        if is_mcp_name(name):
            timeout = min(context.timeout, max(self.session.deadline - time.monotonic(), 1.0))
            text, is_error = self.mcp.call(name, arguments, timeout=timeout, output_cap=context.output_cap)
            return ToolResult(text, is_error)
        if name in self.enabled:
            return run_tool(name, arguments, context)
        have = [n for n in self.enabled if not is_mcp_name(n)] + list(self.mcp.tools)
        return ToolResult(f"unknown tool {name!r}: this agent has {', '.join(have) or 'no tools'}", True)

    def _record(self, call: Mapping[str, Any], result: Any, *, key: str = "", replayed: str = "") -> None:
        entry = {
            "name": call.get("name"),
            "input": brief_input(call.get("input", {})),
            "is_error": result.is_error,
            "result": clip(result.content, 300),
        }
        if key:
            entry["key"] = key  # the journal's idempotency key
        if replayed:
            entry["replayed"] = replayed  # from an earlier attempt's journal: "result" or "interrupted"
        self.executed.append(entry)
        log.debug("run %s: tool %s %s", self.request.run_id, call.get("name"), "refused" if result.is_error else "ran")

    def _reply(
        self, ok: bool, detail: str, *, stopped: bool = False, timed_out: bool = False, delegations: bool = True
    ) -> Reply:
        scrub = self.session.scrub
        calls = storable(json.loads(scrub(json.dumps(self.executed)))) if self.executed else []
        if delegations and not stopped:
            calls.extend(self.delegations)  # accepted: the loop starts them now that the act ends
        return Reply(
            ok=ok,
            text=storable(scrub("\n\n".join(self.texts))),
            usage=self.session.usage,
            detail=scrub(detail),
            tool_calls=calls,
            stopped=stopped,
            timed_out=timed_out,
        )
