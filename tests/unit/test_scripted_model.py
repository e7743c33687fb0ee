"""Unit tests for the offline ScriptedChatModel, load_script and make_model."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from effectgate.errors import ConfigError
from effectgate.models import (
    DEFAULT_OPENAI_MAX_RETRIES,
    ScriptedChatModel,
    load_script,
    make_model,
)
from effectgate.tools import canonical_json

SCRIPT: dict[str, Any] = {
    "name": "t",
    "turns": [
        {"say": "look", "tool_calls": [{"name": "get_error_rate", "args": {"service": "orders"}}]},
        {
            "when": {"path": "result.get_error_rate.error_rate", "op": ">", "value": 0.05},
            "otherwise": "rate {{ result.get_error_rate.error_rate }} is fine",
            "say": "rate is {{ result.get_error_rate.error_rate }}",
            "tool_calls": [
                {
                    "name": "create_ticket",
                    "args": {
                        "rate": "{{ result.get_error_rate.error_rate }}",
                        "title": "rate {{ result.get_error_rate.error_rate }}",
                        "tags": ["{{ result.get_error_rate.tags.1 }}"],
                    },
                }
            ],
        },
        {
            "say": "ticket {{ result.create_ticket.ticket_id }}",
            "tool_calls": [
                {
                    "name": "send_email",
                    "args": {"subject": "T-{{ result.create_ticket.ticket_id }}"},
                }
            ],
        },
    ],
}


def tool_reply(ai: AIMessage, payload: Any, index: int = 0, **kw: Any) -> ToolMessage:
    """Answer one tool call of ``ai`` with JSON content (no ``name``: found via the id)."""
    return ToolMessage(json.dumps(payload), tool_call_id=ai.tool_calls[index]["id"], **kw)


def run_turns(model: ScriptedChatModel, results: dict[str, Any], turns: int) -> list[BaseMessage]:
    """Play ``turns`` turns, answering every tool call with ``results[name]`` as SUCCEEDED."""
    history: list[BaseMessage] = [HumanMessage("go")]
    for _ in range(turns):
        ai = model.invoke(history)
        history.append(ai)
        for i, call in enumerate(ai.tool_calls):
            payload = {"status": "SUCCEEDED", "result": results[call["name"]]}
            history.append(tool_reply(ai, payload, i))
    return history


RESULTS = {
    "get_error_rate": {"error_rate": 0.12, "tags": ["a", "b"]},
    "create_ticket": {"ticket_id": 42},
    "send_email": {"message_id": "<m@x>"},
}


def test_turn_zero_for_fresh_history() -> None:
    """With no AIMessage after the last HumanMessage, turn 0 is played."""
    model = ScriptedChatModel.from_script(SCRIPT)
    ai = model.invoke([SystemMessage("sys"), HumanMessage("go")])
    assert ai.content == "look"
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [
        ("get_error_rate", {"service": "orders"})
    ]


def test_turn_counts_ai_messages_after_last_human_only() -> None:
    """A new HumanMessage restarts the script; AIMessages before it do not count."""
    model = ScriptedChatModel.from_script(SCRIPT)
    history = run_turns(model, RESULTS, 2)
    assert model.invoke(history).content == "ticket 42"
    again = model.invoke([*history, HumanMessage("again")])
    assert again.content == "look"


def test_past_the_end_gives_final_answer() -> None:
    """After the last turn the model answers ``final`` (default "Done.") without calls."""
    history = run_turns(ScriptedChatModel.from_script(SCRIPT), RESULTS, 3)
    done = ScriptedChatModel.from_script(SCRIPT).invoke(history)
    assert done.content == "Done." and done.tool_calls == []
    custom = ScriptedChatModel.from_script({**SCRIPT, "final": "All good."}).invoke(history)
    assert custom.content == "All good."


def test_history_without_human_counts_from_start() -> None:
    """Without any HumanMessage, every AIMessage in the history counts."""
    model = ScriptedChatModel.from_script(SCRIPT)
    first = model.invoke([SystemMessage("sys")])
    reply = tool_reply(first, {"status": "SUCCEEDED", "result": {"error_rate": 0.01}})
    assert model.invoke([SystemMessage("sys"), first, reply]).content == "rate 0.01 is fine"


def test_single_template_keeps_type_and_embedded_is_stringified() -> None:
    """``"{{ x }}"`` keeps the float; text around a template turns it into a string."""
    history = run_turns(ScriptedChatModel.from_script(SCRIPT), RESULTS, 1)
    ai = ScriptedChatModel.from_script(SCRIPT).invoke(history)
    assert ai.content == "rate is 0.12"
    args = ai.tool_calls[0]["args"]
    assert args == {"rate": 0.12, "title": "rate 0.12", "tags": ["b"]}
    assert isinstance(args["rate"], float)


def test_template_uses_most_recent_result_of_that_tool() -> None:
    """Two results of one tool: the later ToolMessage wins, matched by tool_call_id."""
    model = ScriptedChatModel.from_script(
        {"turns": [{"say": "x"}, {"say": "x"}, {"say": "v={{ result.probe.v }}"}]}
    )
    old = AIMessage("", tool_calls=[{"name": "probe", "args": {}, "id": "c1"}])
    new = AIMessage("", tool_calls=[{"name": "probe", "args": {}, "id": "c2"}])
    history = [
        HumanMessage("go"),
        old,
        ToolMessage('{"result": {"v": 1}}', tool_call_id="c1"),
        new,
        ToolMessage('{"result": {"v": 2}}', tool_call_id="c2"),
    ]
    assert model.invoke(history).content == "v=2"


def test_template_without_result_key_resolves_against_whole_object() -> None:
    """Content without a ``result`` key is the value itself."""
    model = ScriptedChatModel.from_script({"turns": [{"say": "x"}, {"say": "{{ result.p.v }}"}]})
    ai = AIMessage("", tool_calls=[{"name": "p", "args": {}, "id": "c1"}])
    history = [HumanMessage("go"), ai, ToolMessage('{"v": [1, 2]}', tool_call_id="c1")]
    assert model.invoke(history).content == "[1, 2]"


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (
            {"status": "REJECTED", "reason": "not now"},
            "(create_ticket was rejected: not now)",
        ),
        ({"status": "FAILED", "error": "HTTP 422"}, "(create_ticket failed: HTTP 422)"),
        (
            {
                "status": "rejected",
                "message": "User rejected the tool call for `create_ticket` with reason: dup. "
                "The tool was not executed. Do not retry this tool call unless the user asks.",
                "executed": False,
            },
            "(create_ticket was rejected: User rejected the tool call for `create_ticket` "
            "with reason: dup)",
        ),
        (
            {"status": "NEEDS_RECONCILIATION"},
            "(create_ticket ended with status NEEDS_RECONCILIATION)",
        ),
        (
            {"status": "SUCCEEDED", "result": {"id": 1}},
            "(create_ticket's result has no 'ticket_id')",
        ),
    ],
)
def test_unresolvable_template_stops_with_honest_message(payload: dict[str, Any], why: str) -> None:
    """A failed/rejected tool ends the run with a message naming the value and the reason."""
    model = ScriptedChatModel.from_script(SCRIPT)
    history = run_turns(model, RESULTS, 1)
    ticket_ai = model.invoke(history)
    history += [ticket_ai, tool_reply(ticket_ai, payload)]
    stop = model.invoke(history)
    assert stop.tool_calls == [] and stop.invalid_tool_calls == []
    assert stop.content == (
        f"I cannot continue: result.create_ticket.ticket_id is not available {why}. "
        "Stopping here; nothing further was proposed."
    )


def test_unresolvable_when_tool_never_ran_or_text_not_json() -> None:
    """No result at all, or non-JSON tool output, are named as such."""
    model = ScriptedChatModel.from_script({"turns": [{"say": "{{ result.nope.x }}"}]})
    assert "(nope has no result in this run)" in str(model.invoke([HumanMessage("go")]).content)
    model = ScriptedChatModel.from_script({"turns": [{"say": "x"}, {"say": "{{ result.p.x }}"}]})
    ai = AIMessage("", tool_calls=[{"name": "p", "args": {}, "id": "c1"}])
    err = ToolMessage("boom", tool_call_id="c1", status="error")
    assert "(p failed)" in str(model.invoke([HumanMessage("go"), ai, err]).content)


def test_when_false_gives_otherwise_and_no_calls() -> None:
    """Below the threshold the ``otherwise`` text (templated) ends the run."""
    low = {**RESULTS, "get_error_rate": {"error_rate": 0.01}}
    history = run_turns(ScriptedChatModel.from_script(SCRIPT), low, 1)
    ai = ScriptedChatModel.from_script(SCRIPT).invoke(history)
    assert ai.content == "rate 0.01 is fine" and ai.tool_calls == []


def test_when_with_incomparable_value_stops_honestly() -> None:
    """A string compared with a number is named, not a crash."""
    bad = {**RESULTS, "get_error_rate": {"error_rate": "n/a"}}
    history = run_turns(ScriptedChatModel.from_script(SCRIPT), bad, 1)
    ai = ScriptedChatModel.from_script(SCRIPT).invoke(history)
    assert ai.tool_calls == []
    assert ai.content.startswith(
        "I cannot continue: result.get_error_rate.error_rate is 'n/a', which cannot be compared"
    )


def test_ids_follow_the_documented_formula() -> None:
    """Tool-call id = call_ + 24 hex of sha256("k:i:name:canonical args")."""
    ai = ScriptedChatModel.from_script(SCRIPT).invoke([HumanMessage("go")])
    seed = f"0:0:get_error_rate:{canonical_json({'service': 'orders'}).decode()}"
    assert ai.tool_calls[0]["id"] == "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]
    assert ai.id is not None and ai.id.startswith("scripted-")


def test_ids_stable_across_instances_and_differ_between_rounds() -> None:
    """Two instances give equal ids; the same turn in a later round gets a new message id."""
    first = run_turns(ScriptedChatModel.from_script(SCRIPT), RESULTS, 3)
    second = run_turns(ScriptedChatModel.from_script(SCRIPT), RESULTS, 3)
    assert [m.id for m in first] == [m.id for m in second]
    assert [m.tool_calls for m in first if isinstance(m, AIMessage)] == [
        m.tool_calls for m in second if isinstance(m, AIMessage)
    ]
    later = ScriptedChatModel.from_script(SCRIPT).invoke([*first, HumanMessage("again")])
    assert later.id != first[1].id
    assert later.tool_calls[0]["id"] == first[1].tool_calls[0]["id"]  # type: ignore[attr-defined]


def test_ids_stable_across_processes() -> None:
    """A fresh interpreter computes the same tool-call and message ids."""
    code = (
        "from langchain_core.messages import HumanMessage;"
        "from effectgate.models import make_model;"
        "ai = make_model('scripted:incident').invoke([HumanMessage('go')]);"
        "print(ai.id, ai.tool_calls[0]['id'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    ai = make_model("scripted:incident").invoke([HumanMessage("go")])
    assert out.stdout.split() == [ai.id, ai.tool_calls[0]["id"]]


def test_fresh_ids_differ_each_call() -> None:
    """fresh_ids=True re-proposes the same call with a new id, like a real model on replay."""
    model = ScriptedChatModel.from_script(SCRIPT, fresh_ids=True)
    a, b = model.invoke([HumanMessage("go")]), model.invoke([HumanMessage("go")])
    assert a.tool_calls[0]["args"] == b.tool_calls[0]["args"]
    assert a.tool_calls[0]["id"] != b.tool_calls[0]["id"] and a.id != b.id
    assert str(a.tool_calls[0]["id"]).startswith("call_")


def test_explicit_and_null_ids() -> None:
    """An explicit id is kept; ``id: null`` emits the call without an id."""
    script = {
        "turns": [
            {
                "tool_calls": [
                    {"name": "a", "args": {}, "id": "call_mine"},
                    {"name": "b", "args": {}, "id": None},
                ]
            }
        ]
    }
    ai = ScriptedChatModel.from_script(script).invoke([HumanMessage("go")])
    assert [c["id"] for c in ai.tool_calls] == ["call_mine", None]


def test_raw_string_args_parse_or_land_in_invalid_tool_calls() -> None:
    """A raw JSON object string becomes args; anything else is an invalid tool call."""
    script = {
        "turns": [
            {
                "tool_calls": [
                    {"name": "ok", "args": '{"n": 1}'},
                    {"name": "bad", "args": "{not json"},
                    {"name": "list", "args": "[1]"},
                ]
            }
        ]
    }
    ai = ScriptedChatModel.from_script(script).invoke([HumanMessage("go")])
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("ok", {"n": 1})]
    assert [(c["name"], c["args"]) for c in ai.invalid_tool_calls] == [
        ("bad", "{not json"),
        ("list", "[1]"),
    ]
    assert all(str(c["id"]).startswith("call_") for c in ai.invalid_tool_calls)


def test_bind_tools_accepts_anything_and_emits_unknown_tools() -> None:
    """bind_tools validates nothing: unknown names and odd args reach the graph as given."""
    script = {"turns": [{"tool_calls": [{"name": "no_such_tool", "args": {"x": [1, None]}}]}]}
    model = ScriptedChatModel.from_script(script)
    bound = model.bind_tools([{"type": "function", "function": {"name": "other"}}, len])
    ai = bound.invoke([HumanMessage("go")])
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("no_such_tool", {"x": [1, None]})]


def test_stream_keeps_tool_calls() -> None:
    """model.stream() yields the whole message, tool calls included."""
    chunks = list(ScriptedChatModel.from_script(SCRIPT).stream([HumanMessage("go")]))
    assert len(chunks) == 1
    assert [c["name"] for c in chunks[0].tool_calls] == ["get_error_rate"]


def test_langgraph_messages_stream_keeps_tool_calls() -> None:
    """Inside graph.stream(stream_mode="messages") the stored AIMessage keeps its tool calls."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    model = ScriptedChatModel.from_script(SCRIPT).bind_tools([])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    app = graph.compile()
    parts = list(app.stream({"messages": [HumanMessage("go")]}, stream_mode=["messages", "values"]))
    final = [data for mode, data in parts if mode == "values"][-1]
    assert [c["name"] for c in final["messages"][-1].tool_calls] == ["get_error_rate"]
    streamed = [data[0] for mode, data in parts if mode == "messages"]
    assert streamed and streamed[-1].tool_calls[0]["name"] == "get_error_rate"


def test_incident_script_full_run_carries_ticket_id() -> None:
    """The packaged demo: read, ticket, then mail + note in parallel, all with the ticket id."""
    results = {
        "get_error_rate": {"error_rate": 0.12},
        "create_ticket": {"ticket_id": 7},
        "send_email": {},
        "write_file": {},
    }
    model = make_model("scripted:incident")
    history = run_turns(model, results, 4)  # type: ignore[arg-type]
    calls = [c for m in history if isinstance(m, AIMessage) for c in m.tool_calls]
    assert [c["name"] for c in calls] == [
        "get_error_rate",
        "create_ticket",
        "send_email",
        "write_file",
    ]
    assert calls[0]["args"] == {"service": "orders", "window_minutes": 5}
    assert calls[1]["args"]["severity"] == "high"
    assert calls[1]["args"]["alert_id"] == "orders-error-rate"
    assert "0.12" in calls[1]["args"]["body"]
    assert calls[2]["args"]["to"] == ["oncall@example.com"]
    assert calls[2]["args"]["subject"] == "[high] orders error rate — TICKET-7"
    assert calls[3]["args"]["path"] == "incidents/orders-error-rate.md"
    assert "TICKET-7" in calls[3]["args"]["content"] and "0.12" in calls[3]["args"]["content"]
    assert "TICKET-7" in str(history[-1].content) and history[-1].tool_calls == []  # type: ignore[attr-defined]


def test_incident_script_below_threshold_does_nothing() -> None:
    """At 1% the demo ends after the read with the 'nothing to do' answer."""
    model = make_model("scripted:incident")
    history = run_turns(model, {"get_error_rate": {"error_rate": 0.01}}, 2)  # type: ignore[arg-type]
    assert history[-1].content == (
        "The order service's error rate is 0.01, below the 5% threshold: nothing to do."
    )


def test_incident_script_rejected_ticket_stops() -> None:
    """A rejected create_ticket stops the demo before mail and note."""
    model = make_model("scripted:incident")
    history = run_turns(model, {"get_error_rate": {"error_rate": 0.5}}, 1)  # type: ignore[arg-type]
    ticket = model.invoke(history)
    history += [ticket, tool_reply(ticket, {"status": "REJECTED"})]
    stop = model.invoke(history)
    assert stop.tool_calls == []
    assert "result.create_ticket.ticket_id is not available (create_ticket was rejected)" in str(
        stop.content
    )


def test_load_script_from_yaml_and_json_files(tmp_path: Any) -> None:
    """Files load by suffix; from_file plays them."""
    (tmp_path / "s.json").write_text(json.dumps({"name": "j", "turns": [{"say": "hi"}]}))
    (tmp_path / "s.yml").write_text("turns:\n  - say: yo\n")
    assert load_script(str(tmp_path / "s.json"))["name"] == "j"
    assert load_script(str(tmp_path / "s.yml"))["name"] == "scripted"
    model = ScriptedChatModel.from_file(tmp_path / "s.yml")
    assert model.invoke([HumanMessage("go")]).content == "yo"
    assert load_script("incident")["name"] == "incident"


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("s.yaml", "turns: [", "invalid YAML"),
        ("s.json", "{", "invalid JSON"),
        ("s.yaml", "- 1\n", "top level: must be a mapping"),
        ("s.yaml", "name: x\n", "'turns' must be a list"),
        ("s.yaml", "turns:\n  - sya: typo\n", r"turns\[0\]: unknown key\(s\) \['sya'\]"),
        ("s.yaml", "turns:\n  - tool_calls: [{args: {}}]\n", "'name' must be a non-empty"),
        ("s.yaml", "turns:\n  - say: '{{ foo }}'\n", "is not result.<tool>.<field>"),
        (
            "s.yaml",
            "turns:\n  - when: {path: result.a.b, op: '~', value: 1}\n",
            "'op' must be one of",
        ),
        ("s.yaml", "turns:\n  - tool_calls: [{name: a, args: {d: 2024-01-01}}]\n", "JSON"),
        ("s.txt", "turns: []\n", "must end in"),
    ],
)
def test_load_script_bad_input_raises_config_error(
    tmp_path: Any, name: str, text: str, match: str
) -> None:
    """Every malformed script is a ConfigError naming the file and the problem."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_script(str(path))
    assert str(path) in str(info.value)


def test_load_script_missing_file_and_unknown_name(tmp_path: Any) -> None:
    """A missing path and an unknown packaged name say what exists."""
    with pytest.raises(ConfigError, match="script file not found"):
        load_script(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match=r"unknown script 'nope'.*'incident'"):
        load_script("nope")


def test_make_model_scripted_and_bad_specs() -> None:
    """scripted: builds the offline model; malformed specs are ConfigErrors."""
    assert isinstance(make_model("scripted:incident", fresh_ids=True), ScriptedChatModel)
    for spec in ("incident", "scripted:", "claude:x", "openai:  "):
        with pytest.raises(ConfigError, match=r"model spec|provider"):
            make_model(spec)


def test_make_model_openai_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --api-key or OPENAI_API_KEY the factory refuses before any I/O."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        make_model("openai:gpt-4o-mini")


def test_make_model_openai_reads_env_and_sets_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Env supplies key and base URL; max_retries, timeout and temperature are explicit."""
    from langchain_openai import ChatOpenAI

    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    model = make_model("openai:local-model", timeout_s=5)
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "local-model"
    assert model.openai_api_base == "http://127.0.0.1:9/v1"
    assert model.openai_api_key is not None
    assert model.openai_api_key.get_secret_value() == "sk-env"
    assert model.max_retries == DEFAULT_OPENAI_MAX_RETRIES == 2
    assert model.request_timeout == 5 and model.temperature == 0
    with pytest.raises(ConfigError, match="max_retries"):
        make_model("openai:x", max_retries=-1)
