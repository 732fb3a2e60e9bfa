"""One declarative schema per settings section: each setting declared once, as data, and every consumer
derived from it.

Why: before this, a setting's type, bounds and error text were written again by every reader (the
``--config`` file's parser, the flags, the admin API, the CRD generator, the docs), and they drifted
(a CRD that accepted what pods refused, flags that took values the file refused). A ``Section`` now
says, per setting, its config-file/CR key, flag, ``TXNKEEPER_*`` env name, type, default, bounds or
choices, unit, description and how its error says the allowed values; ``load`` reads a section from
flags > env > config file > default key by key, ``parse`` checks a (partial) object in any of its
spellings (the admin API's), ``json_schema`` renders the CRD's (and the chart's) fragment and
``doc_table`` the docs' table. Standard library only (docs/contracts.md §0: the operator imports it).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

Kind = Literal["bool", "int", "number", "enum", "text", "list"]  # list: one or more of choices
ENV_PREFIX = "TXNKEEPER_"
# Text from a flag or env variable: ASCII digits only (int() would take "١٢٣", " 12 ", "1_0").
_INT_TEXT = re.compile(r"-?[0-9]{1,19}")
_NUMBER_TEXT = re.compile(r"-?[0-9]{1,19}(\.[0-9]{1,18})?")
INT64_MAX = 2**63 - 1
_UNIT_WORDS = {"ms": "milliseconds", "s": "seconds", "min": "minutes", "bytes": "bytes"}


class SettingValueError(ValueError):
    """A setting is unknown, of the wrong type or outside its allowed values (the message names where)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of a section. ``key`` is its config-file and CR name; ``field`` the Python name of the
    value the section builds; ``spellings`` other names of the key (e.g. ``{"stat": "batchEnabled"}``:
    Pulsar's TxnBufferedWriterStat, the admin API's)."""

    key: str
    field: str
    kind: Kind
    default: Any
    description: str
    flag: str | None = None  # "--srk-max-block-bytes"
    env: str | None = None  # "SRK_MAX_BLOCK_BYTES" (read as TXNKEEPER_SRK_MAX_BLOCK_BYTES)
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    unit: str | None = None  # "ms", "s", "min", "bytes"
    # How an error says the allowed values (default: "in LOW..HIGH"), and what it adds after the value.
    range_text: str | None = None
    hint: str = ""
    spellings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    in_cr: bool = True  # part of the CR's (and the chart's) fragment
    in_file: bool = True  # a key of the config file's section (False: flag and env only)
    # A named check of a text value beyond a pattern (``FORMATS``), e.g. "pulsar-urls".
    format: str | None = None
    cr_default: bool = True  # the CRD fills the default in (False: a CR without it says "not set")
    cr_integer: bool = False  # a number the CR takes in whole units only
    flag_help: str | None = None
    # The whole refusal, when the section words it its own way: "{where}", "{value}" and "{allowed}"
    # are filled in (default: "{where} must be {allowed}, got {value}" and the hint).
    error: str | None = None

    @property
    def env_name(self) -> str | None:
        return ENV_PREFIX + self.env if self.env else None

    @property
    def dest(self) -> str | None:
        """The argparse attribute of the flag."""
        return self.flag.lstrip("-").replace("-", "_") if self.flag else None

    def allowed(self) -> str:
        """What an error says the setting must be: "an integer in 1..16", "true or false", ..."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "enum":
            return f"one of {list(self.choices)}"
        if self.kind == "list":
            return f"a list of one or more of {', '.join(self.choices)}"
        if self.kind == "text" and self.format is not None:
            return FORMATS[self.format][0]
        if self.kind == "text":
            return self.range_text or "a non-empty string" + (
                f" matching {self.pattern}" if self.pattern else ""
            )
        what = "an integer" if self.kind == "int" else "a number"
        if self.unit in _UNIT_WORDS and self.kind == "number":
            what += f" of {_UNIT_WORDS[self.unit]}"
        if self.range_text is not None:
            return f"{what} {self.range_text}"
        unit = f" ({self.unit})" if self.unit and self.kind == "int" else ""
        return f"{what} {self._bounds_text()}{unit}".rstrip()

    def _bounds_text(self) -> str:
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"in {_num(low)}..{_num(high)}"
        if low is not None:
            return f"of at least {_num(low)}"
        return f"of at most {_num(high)}" if high is not None else ""

    def refuse(self, where: str, value: object) -> SettingValueError:
        if self.error is not None:
            return SettingValueError(
                self.error.format(where=where, value=shown(value), allowed=self.allowed())
            )
        return SettingValueError(f"{where} must be {self.allowed()}, got {shown(value)}{self.hint}")

    def check(self, value: object, where: str) -> Any:
        """``value`` (a JSON value: from a config file, a CR or a request) if allowed, else the error."""
        if self.kind == "bool":
            ok = isinstance(value, bool)
        elif self.kind == "enum":
            ok = isinstance(value, str) and value in self.choices
        elif self.kind == "list":
            ok = isinstance(value, list) and bool(value) and all(v in self.choices for v in value)
        elif self.kind == "text" and self.format is not None and isinstance(value, str):
            problem = FORMATS[self.format][1](value)
            if problem is not None:
                raise SettingValueError(f"{where} must be {self.allowed()}: {problem}")
            ok = True
        elif self.kind == "text":
            ok = isinstance(value, str) and bool(value) and _matches(self.pattern, value)
        else:
            ok = self._in_bounds(value)
        if not ok:
            raise self.refuse(where, value)
        if self.kind == "int" and isinstance(value, int) and abs(value) > INT64_MAX:  # a 64-bit ceiling
            raise SettingValueError(f"{where} must be {self.allowed()} that fits 64 bits, got {shown(value)}")
        return value

    def _in_bounds(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        low = -math.inf if self.minimum is None else self.minimum
        high = math.inf if self.maximum is None else self.maximum
        return low <= value <= high

    def from_text(self, text: str, where: str) -> Any:
        """A flag's or env variable's text as this setting's value, checked."""
        value: object = text
        if self.kind == "bool":
            value = {"true": True, "false": False}.get(text, text)
        elif self.kind == "list":
            value = [part.strip() for part in text.split(",") if part.strip()]
        elif self.kind in ("int", "number"):
            value = self._number(text, where)
        return self.check(value, where)

    def _number(self, text: str, where: str) -> object:
        """Text of ASCII digits as a number; anything else stays text, which ``check`` refuses."""
        if self.kind == "int" and _INT_TEXT.fullmatch(text):
            number: int | float = int(text)
        elif self.kind == "number" and _NUMBER_TEXT.fullmatch(text):
            number = float(text)
            number = int(number) if number.is_integer() and "." not in text else number
        else:
            return text
        if text.startswith("-") and number == 0:  # "-0" means no value: refused as the config file's is
            raise SettingValueError(f"{where}={text!r} is a negative zero; write 0")
        return number


@dataclass(frozen=True, slots=True)
class Section:
    """A config-file section (``name``) and its settings, in the order they are documented."""

    name: str
    description: str
    settings: tuple[Setting, ...]
    # Keys of the section that are not one value but a structure (a map of names to limits): the
    # section's own reader checks them (their values through declared settings); parse passes them by.
    structured: tuple[str, ...] = ()
    # How a refusal of unknown keys reads ("{where}", "{unknown}", "{known}" filled in).
    unknown_error: str = "{where}: unknown {noun} {unknown}; known: {known}"

    def keys(self, spelling: str | None = None) -> dict[str, Setting]:
        """Key -> setting, in the config file's spelling or in ``spelling`` (settings without one are
        left out)."""
        if spelling is None:
            return {s.key: s for s in self.settings if s.in_file}
        return {s.spellings[spelling]: s for s in self.settings if spelling in s.spellings}

    def setting(self, key: str) -> Setting:
        return self.keys()[key]

    def defaults(self) -> dict[str, Any]:
        return {s.field: s.default for s in self.settings}


def parse(
    section: Section,
    doc: object,
    where: str,
    *,
    spelling: str | None = None,
    unknown_noun: str = "key(s)",
) -> dict[str, Any]:
    """The fields a (partial) object sets, checked, keyed by field name. ``where`` names the object
    in errors (``"/etc/c.json: singleKeyTransactions"``); each setting is named ``where.key``."""
    keys = section.keys(spelling)
    # A dotted key ("clientAuth.client") is a key of a nested object; its top part is one key here.
    top = {k.partition(".")[0] for k in keys}
    if not isinstance(doc, Mapping):
        raise SettingValueError(
            f"{where} must be an object with keys {', '.join(sorted(top))}, got {type(doc).__name__}"
        )
    flat = _flatten(section, doc, where, top=top, keys=keys, noun=unknown_noun)
    return {keys[k].field: keys[k].check(v, f"{where}.{k}") for k, v in flat.items() if k in keys}


def _flatten(
    section: Section, doc: Mapping[str, Any], where: str, *, top: set[str], keys: Mapping[str, Any], noun: str
) -> dict[str, Any]:
    """``doc`` with its nested objects' keys dotted, after refusing unknown keys at either level."""
    _refuse_unknown(section, doc, where, {*top, *section.structured}, noun)
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        children = sorted(k.partition(".")[2] for k in keys if k.startswith(f"{key}."))
        if not children:
            flat[key] = value
            continue
        if not isinstance(value, Mapping):
            raise SettingValueError(
                f"{where}.{key} must be an object with keys {', '.join(children)}, got {shown(value)}"
            )
        _refuse_unknown(section, value, f"{where}.{key}", set(children), noun)
        flat.update({f"{key}.{child}": v for child, v in value.items()})
    return flat


def _refuse_unknown(section: Section, doc: Mapping[str, Any], where: str, known: set[str], noun: str) -> None:
    unknown = sorted(str(k)[:60] for k in doc if k not in known)
    if unknown:
        raise SettingValueError(
            section.unknown_error.format(where=where, noun=noun, unknown=unknown, known=sorted(known))
        )


@dataclass(frozen=True, slots=True)
class Loaded:
    """A section's values (every field, defaults filled in) and where each came from."""

    values: dict[str, Any]
    # field -> how it was given: "--flag VALUE", "TXNKEEPER_X=VALUE", "FILE: section.key: VALUE", "default"
    sources: dict[str, str]


def load(
    section: Section,
    *,
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    file: object,
    file_where: str,
) -> Loaded:
    """The section's values from flags > env > config file > default, key by key.

    ``flags`` are the parsed arguments (``vars(namespace)``; a flag not given is None), ``environ``
    the process environment (an empty variable counts as unset), ``file`` the config file's section
    (None: no file or no section) and ``file_where`` how errors name it (``"FILE: section"``).
    """
    from_file = parse(section, file, file_where) if file is not None else {}
    values = section.defaults()
    sources = dict.fromkeys(values, "default")
    for s in section.settings:
        flag_text = flags.get(s.dest) if s.dest else None
        env_text = environ.get(s.env_name) if s.env_name else None
        if flag_text is not None:
            values[s.field] = s.from_text(str(flag_text), s.flag or "")
            sources[s.field] = f"{s.flag} {str(flag_text)[:40]}"
        elif env_text:
            name = s.env_name or ""
            values[s.field], sources[s.field] = s.from_text(env_text, name), f"{name}={env_text[:40]}"
        elif s.field in from_file:
            values[s.field] = from_file[s.field]
            sources[s.field] = f"{file_where}.{s.key}: {_json(from_file[s.field])}"
    return Loaded(values, sources)


def add_flags(parser: Any, section: Section) -> None:
    """The section's flags on an argparse parser (or group): text, checked by ``load`` (so an error
    names the flag or the env variable it came from)."""
    for s in section.settings:
        if s.flag:
            parser.add_argument(s.flag, default=None, metavar=_metavar(s), help=flag_help(s))


def _metavar(s: Setting) -> str:
    if s.kind == "bool":
        return "true|false"
    if s.kind == "enum":
        return "|".join(s.choices)
    return "N" if s.kind in ("int", "number") else "TEXT"


def flag_help(s: Setting) -> str:
    """A flag's help: the description, the config key, the env variable and the default."""
    text = s.flag_help or s.description
    default = "" if s.default is None else f"; default {_json(s.default)}"
    return f"{text} (env {s.env_name}{default})" if s.env_name else text


def json_schema(section: Section, *, closed: bool = False, description: str | None = None) -> dict[str, Any]:
    """The OpenAPI v3 fragment of the section's CR fields (a CRD's ``properties``), with each field's
    type, description, default, bounds and choices. ``closed``: refuse unknown keys (the chart's
    values.schema.json; a CRD prunes them instead); ``description`` replaces the section's own."""
    properties: dict[str, Any] = {}
    for s in section.settings:
        top, _, child = s.key.partition(".")
        if not s.in_cr:
            continue
        if child:  # a nested object's key
            group = properties.setdefault(top, {"type": "object", "description": top, "properties": {}})
            group["properties"][child] = property_schema(s)
        else:
            properties[s.key] = property_schema(s)
    schema: dict[str, Any] = {
        "type": "object",
        "description": description or section.description,
        "properties": properties,
    }
    if closed:
        schema["additionalProperties"] = False
    return schema


def property_schema(s: Setting, description: str | None = None) -> dict[str, Any]:
    """One setting's OpenAPI v3 property (``description`` replaces its own)."""
    kind = "integer" if s.kind == "int" or s.cr_integer else _JSON_TYPES[s.kind]
    prop: dict[str, Any] = {"type": kind, "description": description or s.description}
    if s.choices and s.kind == "list":
        prop["items"] = {"type": "string", "enum": list(s.choices)}
        prop["minItems"] = 1
    elif s.choices:
        prop["enum"] = list(s.choices)
    if s.default is not None and s.cr_default:
        prop["default"] = s.default
    if s.minimum is not None:
        prop["minimum"] = s.minimum
    if s.maximum is not None:
        prop["maximum"] = s.maximum
    if s.pattern is not None:
        prop["pattern"] = s.pattern
    return prop


def cr_default(section: Section) -> dict[str, Any]:
    """The whole section's default as a CR block (the API server checks a default against its CEL rules
    as written, without filling in nested defaults)."""
    return {s.key: s.default for s in section.settings if s.in_cr and s.default is not None}


def doc_table(section: Section) -> str:
    """The section as a Markdown table (docs/contracts.md carries it; a test keeps the two equal)."""
    rows = [
        f"| config `{section.name}` key | flag | env | type | default | allowed | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in section.settings:
        kind = s.kind if s.unit is None else f"{s.kind} ({s.unit})"
        key = (f"`{s.key}`" if s.in_file else "(flag/env only)") + "".join(
            f" ({name} `{spelt}`)" for name, spelt in s.spellings.items()
        )
        rows.append(
            f"| {key} | {_code(s.flag)} | {_code(s.env_name)} | {kind} | {_code(_json(s.default))} |"
            f" {s.allowed()} | {s.description} |"
        )
    if section.structured:
        keys = ", ".join(f"`{k}`" for k in section.structured)
        rows.append(f"\nStructured keys (maps checked by the section's reader): {keys}.")
    return "\n".join(rows) + "\n"


_JSON_TYPES = {
    "bool": "boolean",
    "int": "integer",
    "number": "number",
    "enum": "string",
    "text": "string",
    "list": "array",
}


def pulsar_url_problem(url: str) -> str | None:
    """Why ``url`` is not a Pulsar service URL of one pod (None: it is)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{url[:80]!r} is not a URL ({exc}); give pulsar://host:port"
    if parts.scheme != "pulsar" or not parts.hostname or port is None:
        return f"{url[:80]!r} is not pulsar://host:port"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return f"{url[:80]!r} has more than pulsar://host:port"
    return None


def _pulsar_urls_problem(text: str) -> str | None:
    if not text.strip():
        return None  # none given: the pod names itself
    return next(filter(None, (pulsar_url_problem(p.strip()) for p in text.split(","))), None)


# format -> (what an error says is allowed, the check: None or what is wrong)
FORMATS: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "pulsar-urls": ("comma-separated pulsar://host:port, one per pod in ordinal order", _pulsar_urls_problem),
}


def _code(text: str | None) -> str:
    return f"`{text}`" if text else "-"


def _json(value: object) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _matches(pattern: str | None, value: str) -> bool:
    return pattern is None or re.search(pattern, value) is not None


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut short: a request's 10^5-digit integer or deep array must not become a huge
    message (nor hit Python's int-to-text limit, which raises)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, list | dict):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
