// effectgate's review page: the pending review of one thread served by
// `langgraph dev`, read and answered through @langchain/langgraph-sdk's React
// useStream, with nothing but the standard HITL request (LangChain's
// HumanInTheLoopMiddleware shape): each action's name, args and description,
// and each review config's allowed_decisions. effectgate puts what the
// reviewer must see (a possible-duplicate warning first, the preview, the
// effect kind, the operation id) into the description.
//
// Open it as  index.html?api=http://127.0.0.1:2024&thread=<thread id>
// (api defaults to http://127.0.0.1:2024, the `langgraph dev` default).
import React, { useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

const params = new URLSearchParams(window.location.search);
const API = params.get("api") || "http://127.0.0.1:2024";
const THREAD = params.get("thread");
const ASSISTANT = params.get("assistant") || "effectgate";

const css = `
body { font-family: system-ui, sans-serif; margin: 1.5rem; max-width: 52rem; color: #1b1f24; }
.action { border: 1px solid #c8ccd1; border-radius: 6px; padding: 1rem; margin: 1rem 0; }
.description { white-space: pre-wrap; background: #f6f8fa; padding: .75rem; border-radius: 4px;
  font-family: ui-monospace, monospace; font-size: .85rem; }
.warning { background: #fff1c2; border-left: 4px solid #d4a000; padding: .5rem .75rem;
  font-weight: 600; margin: .5rem 0; }
label { display: block; margin: .4rem 0; font-size: .9rem; }
label span { display: inline-block; min-width: 7rem; font-weight: 600; }
input, textarea { font: inherit; width: 34rem; max-width: 100%; }
button { font: inherit; margin-right: .5rem; padding: .3rem .9rem; }
.state { color: #57606a; }
.error { color: #b42318; white-space: pre-wrap; }
`;

function fieldText(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

function parseField(text, original) {
  if (typeof original === "string") return text;
  try {
    return JSON.parse(text);
  } catch {
    return text; // the tool's schema refuses it, and the review says why
  }
}

function Action({ index, action, config, decision, onDecide, disabled }) {
  const [fields, setFields] = useState(() =>
    Object.fromEntries(Object.entries(action.args || {}).map(([k, v]) => [k, fieldText(v)])),
  );
  const [reason, setReason] = useState("");
  const allowed = config?.allowed_decisions || [];
  const lines = (action.description || "").split("\n");
  const warnings = lines.filter((l) => l.startsWith("WARNING:"));
  const edited = () =>
    Object.fromEntries(
      Object.entries(fields).map(([k, v]) => [k, parseField(v, (action.args || {})[k])]),
    );
  return (
    <section className="action" data-testid={`action-${index}`}>
      <h2 data-testid="tool-name">{action.name}</h2>
      {warnings.map((w) => (
        <div className="warning" data-testid="warning" key={w}>
          {w}
        </div>
      ))}
      <div className="description" data-testid="description">
        {action.description}
      </div>
      <form onSubmit={(e) => e.preventDefault()}>
        {Object.keys(fields).map((name) => (
          <label key={name}>
            <span>{name}</span>
            {fields[name].includes("\n") ? (
              <textarea
                name={name}
                data-testid={`arg-${name}`}
                rows={Math.min(8, fields[name].split("\n").length)}
                value={fields[name]}
                disabled={disabled}
                onChange={(e) => setFields({ ...fields, [name]: e.target.value })}
              />
            ) : (
              <input
                name={name}
                data-testid={`arg-${name}`}
                value={fields[name]}
                disabled={disabled}
                onChange={(e) => setFields({ ...fields, [name]: e.target.value })}
              />
            )}
          </label>
        ))}
        <label>
          <span>reason</span>
          <textarea
            data-testid="reason"
            rows={2}
            value={reason}
            disabled={disabled}
            placeholder="why you reject it (sent to the agent)"
            onChange={(e) => setReason(e.target.value)}
          />
        </label>
        {allowed.includes("approve") && (
          <button disabled={disabled} data-testid="approve" onClick={() => onDecide({ type: "approve" })}>
            Approve
          </button>
        )}
        {allowed.includes("edit") && (
          <button
            disabled={disabled}
            data-testid="edit"
            onClick={() =>
              onDecide({ type: "edit", edited_action: { name: action.name, args: edited() } })
            }
          >
            Edit
          </button>
        )}
        {allowed.includes("reject") && (
          <button
            disabled={disabled || !reason.trim()}
            data-testid="reject"
            onClick={() => onDecide({ type: "reject", message: reason.trim() })}
          >
            Reject with reason
          </button>
        )}
        {decision && <p className="state" data-testid="decided">decided: {decision.type}</p>}
      </form>
    </section>
  );
}

function Review({ stream, item }) {
  const request = item.value;
  const actions = request.action_requests || [];
  const [decisions, setDecisions] = useState({});
  const [sent, setSent] = useState(false);
  const decide = (i, d) => {
    if (sent) return; // one answer per review shown: a double click sends it once
    const next = { ...decisions, [i]: d };
    setDecisions(next);
    if (Object.keys(next).length === actions.length) {
      setSent(true);
      const answer = { decisions: actions.map((_, j) => next[j]), reviewer: "web-review" };
      stream.submit(null, { command: { resume: { [item.id]: answer } } });
    }
  };
  return (
    <div data-testid="review" data-interrupt-id={item.id}>
      <p className="state">
        Review {item.id} of thread {request.thread_id}: {actions.length} call(s) wait for a decision.
      </p>
      {request.error && (
        <p className="error" data-testid="review-error">
          {request.error}
        </p>
      )}
      {actions.map((action, i) => (
        <Action
          key={`${item.id}-${i}`}
          index={i}
          action={action}
          config={(request.review_configs || [])[i]}
          decision={decisions[i]}
          disabled={sent || stream.isLoading}
          onDecide={(d) => decide(i, d)}
        />
      ))}
    </div>
  );
}

function lastAnswer(values) {
  const messages = (values && values.messages) || [];
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    const m = messages[i];
    const type = m.type || m._getType?.();
    if (type === "ai" && typeof m.content === "string" && m.content) return m.content;
  }
  return null;
}

function App() {
  const stream = useStream({
    apiUrl: API,
    assistantId: ASSISTANT,
    threadId: THREAD,
    messagesKey: "messages",
    fetchStateHistory: false,
  });
  const item = stream.interrupt;
  const isReview = item && item.value && item.value.type === "review";
  const final = lastAnswer(stream.values);
  return (
    <main>
      <style>{css}</style>
      <h1>effectgate review</h1>
      {!THREAD && <p className="error">Open this page with ?thread=&lt;thread id&gt;.</p>}
      {stream.error && (
        <p className="error" data-testid="stream-error">
          {String(stream.error?.message || stream.error)}
        </p>
      )}
      {isReview ? (
        <Review key={item.id} stream={stream} item={item} />
      ) : (
        <div data-testid={stream.isLoading ? "loading" : "idle"}>
          <p className="state">
            {stream.isLoading ? "Running…" : "No review is pending on this thread."}
          </p>
          {!stream.isLoading && final && (
            <p data-testid="final-message" className="description">
              {final}
            </p>
          )}
        </div>
      )}
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
