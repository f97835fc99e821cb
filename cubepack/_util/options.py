"""A verb's settings as one frozen value (``PackOptions``, ``PullOptions``...), built from the
keyword arguments the verb has always taken: a public operation takes a few parameters and an
options object, never a long list (``tests/docs/test_public_verbs.py`` measures them)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

from ..errors import UsageError

T = TypeVar("T", bound="Options")


class Options:
    """Base of a frozen dataclass of a verb's settings: :meth:`build` sets fields over an
    options object given (or the defaults); :meth:`take` splits a verb's keyword arguments
    into its own and the rest (a trust policy's fields)."""

    #: the verb whose settings these are, for messages
    VERB: ClassVar[str] = "this verb"

    @classmethod
    def names(cls) -> set[str]:
        """Its fields' names, the keyword arguments it takes."""
        return {entry.name for entry in dataclasses.fields(cls)}  # type: ignore[arg-type]

    @classmethod
    def build(cls: type[T], options: T | None = None, **fields: Any) -> T:
        """``options`` (or the defaults) with ``fields`` set over it.

        Raises:
            UsageError: a name that is no field (a typo is never ignored), or ``options``
                that is not of this type.
        """
        unknown = sorted(set(fields) - cls.names())
        if unknown:
            raise UsageError(f"{cls.VERB} takes no option {', '.join(unknown)}; its options: "
                             f"{', '.join(sorted(cls.names()))}.")
        if options is not None and not isinstance(options, cls):
            raise UsageError(f"{cls.VERB}'s options must be a {cls.__name__}, not "
                             f"{type(options).__name__}.")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **fields)  # type: ignore[type-var]

    @classmethod
    def take(cls: type[T], options: T | None,
             fields: dict[str, Any]) -> tuple[T, dict[str, Any]]:
        """(the options, the fields that are not its own): a verb whose keyword arguments
        also carry a trust policy's fields hands those on."""
        own = {name: value for name, value in fields.items() if name in cls.names()}
        return cls.build(options, **own), {name: value for name, value in fields.items()
                                          if name not in own}
