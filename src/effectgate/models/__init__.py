"""Chat models: the offline scripted model (the embedded default) and the OpenAI factory.

``make_model("scripted:incident")`` plays the packaged demo script offline;
``make_model("openai:<model>", base_url=...)`` talks to any OpenAI-compatible
server. See ``effectgate.models._factory`` for how model retries relate to the
ledger's attempts (they never multiply).
"""

from __future__ import annotations

from effectgate.models._factory import DEFAULT_OPENAI_MAX_RETRIES, load_script, make_model
from effectgate.models._scripted import ScriptedChatModel

__all__ = [
    "DEFAULT_OPENAI_MAX_RETRIES",
    "ScriptedChatModel",
    "load_script",
    "make_model",
]
