"""The old name of :mod:`selfrag.inference.prompted` (the prompted-critic baseline, ``PromptedSelfRAG``).

Kept so that ``from selfrag.inference.critic import PromptedSelfRAG`` (as the README once showed) still works;
new code imports :mod:`selfrag.inference.prompted`.
"""

from selfrag.inference.prompted import BEHAVIOUR_VERSION, CriticSettings, PromptedSelfRAG, parse_verdict

__all__ = ["BEHAVIOUR_VERSION", "CriticSettings", "PromptedSelfRAG", "parse_verdict"]
