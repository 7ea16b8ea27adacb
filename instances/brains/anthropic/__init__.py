"""The `anthropic` brain and the `llm` decider: Claude, through the official SDK, with the user's key.

The package's modules: `config` (its settings and bounds), `session` (the SDK client, retries,
errors, the key check — the only module of Tether that imports `anthropic`), `messages` (the
shapes of a Messages request), `act` (`AnthropicBrain`, the tool-use act loop) and `decider`
(`decide`). Nothing is re-exported here: import each name from its module.

Runs in the worker; holds no database transaction and makes network calls. Provider words
(`tool_use`, `end_turn`, HTTP 529) stop in this package.

`AnthropicBrain(instance).act(request)` is one bounded tool-use exchange: the instance's
system prompt and the run's objective (the stable, cached prefix), then the history of
earlier iterations as the loop compacted it (`request.history`, `loops.compaction`), the
latest checks and the instruction; the instance's
tools; at most `max_tool_turns` tool turns and `max_output_tokens` output tokens. The
assistant's content is sent back exactly as received (the raw JSON blocks) before the
tool results. A stop request is honoured between tool turns, during a tool and by
abandoning the model call in flight (the call runs in a worker thread that is polled).

With a journal (`request.journal`, loops.journal in a run) every tool call, built-in or MCP,
and every approved call run at the start (turn 0) is recorded under an idempotency key (run,
iteration, turn, call: "r12-i3-t2-c0") before it runs and again with its result. A re-run of
the iteration after its worker died rebuilds the conversation from the journal: the model's
journaled answers verbatim (it is not asked again), finished calls' recorded results, and for a
call started but never finished an error result saying it was interrupted and its effect is
unknown; calls of a journaled turn that never started run now, then the act goes on as usual.
A call that cannot be journaled is not run: the act fails.

`decide(instance, snapshot)` asks Claude for `{verdict, reason, next_instruction}` through an
optional (`auto`) tool, and returns the raw answer text for `loops.decision.parse`; the
snapshot's `history` is compacted by its caller too.

Errors: a missing key, 401/403, or a billing refusal (402, or a 400 whose message says
"credit balance") raise `CredentialError` at once, with no retry. 408/409/429/5xx/529,
timeouts and dropped connections are retried with jittered exponential backoff, at most
`TETHER_ANTHROPIC_RETRIES` retries per act; past that `ProviderError`. Other 4xx raise
`ProviderError` without retry. Every raised error carries the usage of every call made.

Keys: the SDK is always given `api_key` and `base_url` explicitly (it never reads the
environment or local profiles); the key is scrubbed from every text this package returns,
raises or logs, and tools never see it (commands get a minimal environment).

Settings (declared, with their defaults, in tether/settings.py): TETHER_ANTHROPIC_RETRIES,
TETHER_ANTHROPIC_BACKOFF_SECONDS, TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS,
TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS, TETHER_ANTHROPIC_MAX_TOKENS_PER_CALL,
TETHER_ANTHROPIC_DEFAULT_MODEL (read in `config`). The history's share of the prompt,
TETHER_CONTEXT_BUDGET_TOKENS and TETHER_CONTEXT_RECENT, is the loop's to apply (`loops.compaction`).
"""
