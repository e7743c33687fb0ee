"""An offline chat model that plays a script of turns, deterministically from the history.

The turn to play is derived from the messages alone (the number of AIMessages
after the last HumanMessage), never from instance state, so a resumed, replayed
or restarted run in a new process sees the same answer for the same history.
Templates ``{{ result.<tool>.<field> }}`` read earlier tool results out of the
ToolMessages in that history (for example the ticket number in a mail subject).

LangChain's own fakes do not fit (in langchain-core 1.8): they lack
``bind_tools``, ``GenericFakeChatModel`` drops tool calls when streamed, and
``FakeMessagesListChatModel`` keeps its position on the instance and cycles.
This model implements only ``_generate``; ``stream()`` then falls back to one
whole message, so tool calls survive LangGraph's ``stream_mode="messages"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    InvalidToolCall,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable

from effectgate._intent import canonical_json

__all__ = ["DEFAULT_FINAL", "ScriptedChatModel", "validate_script"]

from effectgate.models._script import (
    _DETAIL_CHARS,
    _OPS,
    _OUTCOMES,
    _SUCCESS,
    _TEMPLATE_RE,
    DEFAULT_FINAL,
    load_script,
    validate_script,
)


class _Unresolved(Exception):
    """A template or condition cannot be evaluated; carries the sentence for the user."""


def _text_of(message: BaseMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = [p if isinstance(p, str) else str(p.get("text", "")) for p in message.content]
    return "".join(parts)


def _status_phrase(tool: str, obj: Any, message: ToolMessage) -> str:
    status = obj.get("status") if isinstance(obj, Mapping) else None
    if not isinstance(status, str):
        status = "error" if message.status == "error" else None
    if status is None or status.lower() in _SUCCESS:
        return ""
    low = status.lower()
    phrase = {"rejected": "was rejected", "failed": "failed", "error": "failed"}.get(
        low, f"ended with status {status}"
    )
    detail = ""
    if isinstance(obj, Mapping):
        found = [obj[k] for k in ("reason", "error", "message") if isinstance(obj.get(k), str)]
        # The first sentence carries the reason; the rest is advice meant for the model.
        detail = f": {found[0].split('. ')[0].rstrip('.')[:_DETAIL_CHARS]}" if found else ""
    return f"{tool} {phrase}{detail}"


def _outcome_phrase(tool: str, message: ToolMessage) -> str | None:
    """One side effect's outcome in words, from its ToolMessage; ``None`` for a read."""
    try:
        obj = json.loads(_text_of(message))
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, Mapping) or "operation_id" not in obj:
        return None  # reads and malformed calls carry no operation
    status = str(obj.get("status", "")).lower()
    if status in _SUCCESS:
        ref = obj.get("reference")
        where = f" ({ref})" if isinstance(ref, str) and ref else ""
        if obj.get("reused"):
            return f"{tool} was not repeated: its earlier receipt{where} was reused"
        return f"{tool} ran{where}"
    if status == "superseded":
        return f"{tool} was superseded by a new message and not executed"
    return _status_phrase(tool, obj, message) or f"{tool} did not run"


class _History:
    """The latest ToolMessage per tool name, found via the tool call each one answers."""

    def __init__(self, messages: Sequence[BaseMessage]) -> None:
        names: dict[str, str] = {}
        self.latest: dict[str, ToolMessage] = {}
        self.outcomes: list[str] = []
        """What each side effect since the last human message did, in order."""
        for message in messages:
            if isinstance(message, HumanMessage):
                self.outcomes = []
            elif isinstance(message, AIMessage):
                for call in [*message.tool_calls, *message.invalid_tool_calls]:
                    if call.get("id") and call.get("name"):
                        names[str(call["id"])] = str(call["name"])
            elif isinstance(message, ToolMessage):
                name = names.get(message.tool_call_id) or message.name
                if name:
                    self.latest[name] = message
                    phrase = _outcome_phrase(name, message)
                    if phrase is not None:
                        self.outcomes.append(phrase)

    def resolve(self, ref: str) -> Any:
        """Return the value at ``result.<tool>.<field>...``, or raise ``_Unresolved``.

        ``outcomes`` is the sentence of what each side effect since the last
        human message did (ran, reused, rejected, failed).
        """
        if ref == _OUTCOMES:
            return "; ".join(self.outcomes) if self.outcomes else "no side effect ran"
        _, tool, *fields = ref.split(".")
        message = self.latest.get(tool)
        if message is None:
            raise _Unresolved(f"{ref} is not available ({tool} has no result in this run)")
        text = _text_of(message)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            why = _status_phrase(tool, {}, message) or f"{tool} returned text that is not JSON"
            raise _Unresolved(f"{ref} is not available ({why})") from None
        value = obj["result"] if isinstance(obj, Mapping) and "result" in obj else obj
        for field in fields:
            if isinstance(value, Mapping) and field in value:
                value = value[field]
            elif isinstance(value, list) and field.isdigit() and int(field) < len(value):
                value = value[int(field)]
            else:
                why = _status_phrase(tool, obj, message) or f"{tool}'s result has no {field!r}"
                raise _Unresolved(f"{ref} is not available ({why})")
        return value


def _render(value: Any, history: _History) -> Any:
    if isinstance(value, str):
        whole = _TEMPLATE_RE.fullmatch(value.strip())
        if whole:
            # A string that is exactly one template keeps the value's type (a number
            # stays a number), so args validate against the tool's schema as intended.
            return history.resolve(whole.group(1))

        def embed(match: re.Match[str]) -> str:
            found = history.resolve(match.group(1))
            return found if isinstance(found, str) else json.dumps(found, ensure_ascii=False)

        return _TEMPLATE_RE.sub(embed, value)
    if isinstance(value, Mapping):
        return {key: _render(item, history) for key, item in value.items()}
    if isinstance(value, list):
        return [_render(item, history) for item in value]
    return value


def _render_final(value: str, history: _History) -> str:
    """The final answer's text, with any template filled in where it resolves."""
    try:
        return str(_render(value, history))
    except _Unresolved:
        return value


def _holds(when: Mapping[str, Any], history: _History) -> bool:
    found = history.resolve(when["path"])
    try:
        return bool(_OPS[when["op"]](found, when["value"]))
    except TypeError:
        raise _Unresolved(
            f"{when['path']} is {found!r}, which cannot be compared with {when['value']!r}"
        ) from None


# --- ids and messages -------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def _canonical_args(args: Any) -> str:
    if isinstance(args, str):
        return args
    try:
        return canonical_json(args).decode("utf-8")
    except (TypeError, ValueError):
        # A tool result may carry NaN into args; the id must still be stable.
        return json.dumps(args, sort_keys=True, default=str)


def _parse_raw_args(raw: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _build_calls(
    k: int,
    calls: Sequence[Mapping[str, Any]],
    history: _History,
    *,
    fresh_ids: bool,
    salt: str = "",
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    good: list[ToolCall] = []
    bad: list[InvalidToolCall] = []
    for i, call in enumerate(calls):
        name, args = call["name"], _render(call.get("args", {}), history)
        if "id" in call:
            call_id = call["id"]  # explicit, or None to emit a malformed call without id
        elif fresh_ids:
            call_id = f"call_{uuid.uuid4().hex[:24]}"
        else:
            # ``salt`` (the follow-up number) keeps a follow-up's ids apart
            # from the task's: a real model never reuses a call id.
            call_id = f"call_{_digest(f'{salt}{k}:{i}:{name}:{_canonical_args(args)}')}"
        parsed = _parse_raw_args(args) if isinstance(args, str) else args
        if parsed is None:
            # Same outcome as ChatOpenAI for arguments that are not a JSON object.
            error = "arguments are not a JSON object"
            bad.append(invalid_tool_call(name=name, args=args, id=call_id, error=error))
        else:
            good.append(tool_call(name=name, args=parsed, id=call_id))
    return good, bad


class ScriptedChatModel(BaseChatModel):
    """A deterministic offline chat model that plays a script of turns with real tool calls.

    Turn ``k`` is played when the input holds ``k`` AIMessages after its last
    HumanMessage; past the end it answers ``final`` (default ``"Done."``). A
    turn with a false ``when`` answers its ``otherwise`` text and ends the run.
    A template that cannot be resolved (the tool failed or was rejected) ends
    the run with a message naming the missing value and why. Tool-call ids are
    ``call_`` + 24 hex of SHA-256 over ``"{k}:{i}:{name}:{canonical args}"``
    unless the script gives an ``id`` (``null`` = emit the call without an id)
    or ``fresh_ids`` is set (uuid4, like a real model re-proposing on replay).

    Note:
        Safe to use across interrupts, crashes and processes: no instance state
        decides the turn. ``bind_tools`` validates nothing, so unknown tools and
        bad arguments reach the graph as given (a malformed model output).
    """

    script: dict[str, Any]
    """The validated script: ``{"name": str, "turns": [...], "final"?: str}``."""
    fresh_ids: bool = False
    """True: random tool-call and message ids on every call; False: deterministic."""

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, fresh_ids: bool = False
    ) -> ScriptedChatModel:
        """Load a YAML/JSON script (or a packaged name such as ``"incident"``).

        Args:
            path: a ``.yaml``/``.yml``/``.json`` path or a packaged script name.
            fresh_ids: random ids instead of deterministic ones.

        Returns:
            A model playing that script.

        Raises:
            ConfigError: the file is missing, unreadable or has a bad shape.
        """
        return cls(script=load_script(str(path)), fresh_ids=fresh_ids)

    @classmethod
    def from_script(
        cls, script: Mapping[str, Any], *, fresh_ids: bool = False
    ) -> ScriptedChatModel:
        """Build a model from an in-memory script mapping.

        Args:
            script: ``{"name": str, "turns": [...], "final"?: str}``.
            fresh_ids: random ids instead of deterministic ones.

        Returns:
            A model playing a validated copy of ``script``.

        Raises:
            ConfigError: the script has a bad shape.
        """
        return cls(script=validate_script(script), fresh_ids=fresh_ids)

    @property
    def _llm_type(self) -> str:
        return "effectgate-scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"script_name": self.script.get("name", "scripted")}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Accept any tools and return this model; the script, not the tools, decides calls."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.respond(messages))])

    def respond(self, messages: Sequence[BaseMessage]) -> AIMessage:
        """Return the AIMessage the script gives for this history (pure, deterministic).

        Args:
            messages: the full input history, as the graph passes it.

        Returns:
            The scripted turn, an ``otherwise`` answer, an honest stop message,
            or the final answer; never raises for bad tool results.
        """
        humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
        start = humans[-1] + 1 if humans else 0
        k = sum(1 for m in messages[start:] if isinstance(m, AIMessage))
        # 0: the task; 1, 2, ...: follow-up messages. A script without
        # ``followups`` plays ``turns`` again after every human message.
        h = max(len(humans) - 1, 0) if "followups" in self.script else 0
        part = self._part(h)
        turns: list[dict[str, Any]] = part.get("turns", [])
        history = _History(messages)
        calls: tuple[list[ToolCall], list[InvalidToolCall]] = ([], [])
        if k >= len(turns):
            content = str(_render_final(part.get("final", DEFAULT_FINAL), history))
        else:
            content, calls = self._play(k, turns[k], history, salt=f"{h}:" if h else "")
        return self._message(len(messages), k, content, *calls)

    def _part(self, h: int) -> Mapping[str, Any]:
        """The script for the ``h``-th human message: the task's, or ``followups[h-1]``.

        A follow-up past the list answers the top-level ``final``.
        """
        if h == 0:
            return self.script
        followups: list[dict[str, Any]] = self.script.get("followups", [])
        if h <= len(followups):
            return {"final": self.script.get("final", DEFAULT_FINAL), **followups[h - 1]}
        return {"final": self.script.get("final", DEFAULT_FINAL)}

    def _play(
        self, k: int, turn: Mapping[str, Any], history: _History, *, salt: str = ""
    ) -> tuple[str, tuple[list[ToolCall], list[InvalidToolCall]]]:
        try:
            if "when" in turn and not _holds(turn["when"], history):
                when = turn["when"]
                default = f"Nothing to do: {when['path']} {when['op']} {when['value']!r} is false."
                return str(_render(turn.get("otherwise", default), history)), ([], [])
            content = str(_render(turn.get("say", ""), history))
            return content, _build_calls(
                k, turn.get("tool_calls", []), history, fresh_ids=self.fresh_ids, salt=salt
            )
        except _Unresolved as exc:
            stop = f"I cannot continue: {exc}. Stopping here; nothing further was proposed."
            return stop, ([], [])

    def _message(
        self,
        position: int,
        k: int,
        content: str,
        calls: list[ToolCall],
        bad: list[InvalidToolCall],
    ) -> AIMessage:
        if self.fresh_ids:
            message_id = f"scripted-{uuid.uuid4().hex[:24]}"
        else:
            # The history length is part of the id so that a second task on the same
            # thread never reuses an id: add_messages would replace the old message.
            ids = ",".join(str(c["id"]) for c in [*calls, *bad])
            seed = f"{self.script['name']}:{position}:{k}:{content}:{ids}"
            message_id = f"scripted-{_digest(seed)}"
        return AIMessage(
            content=content,
            tool_calls=calls,
            invalid_tool_calls=bad,
            id=message_id,
            response_metadata={"model_name": f"scripted:{self.script['name']}"},
        )
