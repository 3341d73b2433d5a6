"""User-facing errors.

Every mistake a user can make (a bad config value, a malformed input line, an unknown model name)
raises a subclass of :class:`SelfragError`. The CLI prints these as one line without a traceback;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SelfragError(Exception):
    """Base class of errors caused by user input; the message says what was wrong and the fix."""


class ConfigError(SelfragError, ValueError):
    """A config file, key or value is invalid. Holds every problem found, not just the first."""

    def __init__(self, problems: list[str]) -> None:
        # One line per problem, each once: the CLI prints them as they are.
        self.problems = list(dict.fromkeys(" ".join(str(problem).split("\n")) for problem in problems))
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} config problems:\n  - " + "\n  - ".join(self.problems)
        super().__init__(message)


class InputError(SelfragError, ValueError):
    """An input file (corpus, queries, records) is missing or malformed."""


class ModelNotFoundError(SelfragError, ValueError):
    """A model name is neither a known alias, a local directory, nor a hub id."""


class TokenizerError(SelfragError, ValueError):
    """A tokenizer does not map each reflection string to exactly one id."""


class TrajectoryParseError(SelfragError, ValueError):
    """Generated text or token ids do not form a well-formed reflection trajectory."""


class UsageError(SelfragError, ValueError):
    """The command line itself is wrong (no question, two questions, an option the command does not take)."""
