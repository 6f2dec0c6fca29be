"""The model service: what answers the OpenAI-compatible calls agents make from inside
sandboxes (the channel that carries them out of a no-network sandbox is
``runtime/model_channel.py``).

    from rockroll.sandbox.modelservice import ModelService, ProxyMode
    with ModelService(ProxyMode("http://127.0.0.1:9000/v1"), records="calls.jsonl") as svc:
        os.environ["ROCKROLL_MODEL_TOKEN"] = svc.token
        with open_sandbox(SandboxSpec(model_endpoint=svc.url)) as sb:
            sb.run("python agent.py")   # sees OPENAI_BASE_URL and its own OPENAI_API_KEY

``server.py`` is the HTTP server (FastAPI, imported lazily), ``modes.py`` the generator
interface and its modes (policy, proxy, replay, hand-off), ``protocol.py`` the OpenAI wire format,
``tools.py`` the tool-call parsers, ``records.py`` the per-call JSONL records.
See docs/modelservice.md.
"""

from .modes import (Answer, Call, Caller, Choice, Generator, HandoffMode, ModeError, PendingCall, Policy, PolicyMode,
                    ProxyMode, ReplayMode, Sample, Sampling)
from .records import Recorder
from .server import ModelService
from .tools import PARSERS, parse_hermes

__all__ = ["Answer", "Call", "Caller", "Choice", "Generator", "HandoffMode", "ModeError", "ModelService", "PARSERS",
           "PendingCall", "Policy", "PolicyMode", "ProxyMode", "Recorder", "ReplayMode", "Sample", "Sampling",
           "parse_hermes"]
