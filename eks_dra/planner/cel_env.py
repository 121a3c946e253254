"""The CEL environment of DRA device selectors (Kubernetes 1.34, `dynamic-resource-allocation/cel`).

One variable, `device`, with `driver` (string), `attributes` (domain -> identifier -> value) and `capacity`
(domain -> identifier -> Quantity). Unqualified attribute keys belong to the driver's domain. Kubernetes
returns an empty map for a domain a device does not have, but an unknown identifier is an evaluation error;
the CEL library raises KeyError for any missing key, so every domain that an expression indexes with a
literal (`device.attributes["x.io"]`) is added to each device as an empty map. Each expression is compiled
once per plan. Quantity and Semver travel as tagged maps (see values.py) with Kubernetes' functions.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import cel
from cel import stdlib as cel_stdlib

from eks_dra.devices import AttributeValue, Version
from eks_dra.devices.model import parse_quantity
from eks_dra.errors import ECHO_LIMIT, UserError, shown

from .cel_cost import MAX_COST, estimated_cost
from .values import (
    compare_semver,
    parse_semver,
    quantity_of,
    quantity_value,
    semver_of,
    semver_value,
)

# The CEL library logs every failing Python function through the root logger's last-resort handler;
# a failing selector is reported by the planner instead.
_cel_log = logging.getLogger("cel")
_cel_log.addHandler(logging.NullHandler())
_cel_log.propagate = False

MAX_EXPRESSION_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength, in bytes
_INT64 = 2**63


class SelectorRuntimeError(Exception):
    """A CEL evaluation error on one device; in Kubernetes it aborts the allocation attempt."""


# --- Kubernetes library functions (quantity and semver) ---------------------------------------------

def _no_overload(name: str) -> TypeError:
    return TypeError(f"no such overload: {name}")


def _ordered(name: str, a: object, b: object) -> int:
    qa, qb = quantity_of(a), quantity_of(b)
    if qa is not None and qb is not None:
        return (qa > qb) - (qa < qb)
    sa, sb = semver_of(a), semver_of(b)
    if sa is not None and sb is not None:
        return compare_semver(sa, sb)
    raise _no_overload(name)


def _quantity_arg(name: str, value: object) -> Fraction:
    q = quantity_of(value)
    if q is None:
        raise _no_overload(name)
    return q


def _arith(name: str, sign: int) -> Callable[[object, object], dict]:
    def fn(a: object, b: object) -> dict:
        left = _quantity_arg(name, a)
        right = Fraction(b) if isinstance(b, int) and not isinstance(b, bool) else _quantity_arg(name, b)
        return {"@quantity": str(left + sign * right)}
    return fn


def _as_integer(q: object) -> int:
    value = _quantity_arg("asInteger", q)
    if value.denominator != 1 or not -_INT64 <= value < _INT64:
        raise ValueError("cannot convert value to integer")
    return int(value)


def _is_quantity(s: object) -> bool:
    try:
        parse_quantity(s)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def _is_semver(s: object, normalize: bool = False) -> bool:
    try:
        parse_semver(s, normalize)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def _semver_part(index: int, name: str) -> Callable[[object], int]:
    def fn(v: object) -> int:
        parts = semver_of(v)
        if parts is None:
            raise _no_overload(name)
        return parts[index]
    return fn


KUBERNETES_FUNCTIONS: dict[str, Callable] = {
    "quantity": quantity_value,
    "isQuantity": _is_quantity,
    "semver": semver_value,
    "isSemver": _is_semver,
    "isGreaterThan": lambda a, b: _ordered("isGreaterThan", a, b) > 0,
    "isLessThan": lambda a, b: _ordered("isLessThan", a, b) < 0,
    "compareTo": lambda a, b: _ordered("compareTo", a, b),
    "sign": lambda q: (lambda v: (v > 0) - (v < 0))(_quantity_arg("sign", q)),
    "isInteger": lambda q: _quantity_arg("isInteger", q).denominator == 1,
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: float(_quantity_arg("asApproximateFloat", q)),
    "add": _arith("add", 1),
    "sub": _arith("sub", -1),
    "major": _semver_part(0, "major"),
    "minor": _semver_part(1, "minor"),
    "patch": _semver_part(2, "patch"),
}
# cel-go extension functions that the Kubernetes base environment also offers (strings, sets, lists, math),
# as far as the CEL library implements them. `contains` stays the native string function.
_EXTENSION_FUNCTIONS: dict[str, Callable] = {
    name: fn for name, fn in cel_stdlib.STDLIB_FUNCTIONS.items() if name not in ("contains", "bool")
}
_FUNCTIONS = {**_EXTENSION_FUNCTIONS, **KUBERNETES_FUNCTIONS}
# Functions the CEL library implements natively (macros, conversions, string and time functions).
_NATIVE_FUNCTIONS = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string", "bytes",
    "timestamp", "duration", "dyn", "type", "has", "all", "exists", "exists_one", "map", "filter", "max", "min",
    "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getHours", "getMilliseconds",
    "getMinutes", "getMonth", "getSeconds",
})

_DOMAIN_INDEX = re.compile(r"\b(?:attributes|capacity)\s*\[\s*(?:\"([^\"\\]*)\"|'([^'\\]*)')\s*\]")
_COMPREHENSION_VAR = re.compile(r"\b(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")


# --- cel.bind -----------------------------------------------------------------------------------------

def _skip_string(text: str, i: int) -> int:
    """Index just past the string literal starting at text[i] (a quote, possibly after r/b prefixes)."""
    quote = text[i]
    if text.startswith(quote * 3, i):
        end = text.find(quote * 3, i + 3)
        return len(text) if end < 0 else end + 3
    j = i + 1
    while j < len(text) and text[j] != quote:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _split_call(text: str, start: int) -> tuple[list[str], int]:
    """Arguments of the call whose '(' is at text[start], split at depth-0 commas; and the index past ')'."""
    args, depth, i, last = [], 0, start, start + 1
    while i < len(text):
        c = text[i]
        if c in "'\"":
            i = _skip_string(text, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[last:i])
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(text[last:i])
            last = i + 1
        i += 1
    raise ValueError("unbalanced parentheses in cel.bind")


def rewrite_bind(expression: str) -> str:
    """Rewrite `cel.bind(x, init, body)` (not in the CEL library) as the equivalent `[init].map(x, body)[0]`."""
    out, i = [], 0
    while i < len(expression):
        c = expression[i]
        if c in "'\"":
            j = _skip_string(expression, i)
            out.append(expression[i:j])
            i = j
            continue
        m = re.compile(r"cel\s*\.\s*bind\s*\(").match(expression, i)
        if m and (i == 0 or not (expression[i - 1].isalnum() or expression[i - 1] in "_.")):
            args, end = _split_call(expression, m.end() - 1)
            if len(args) != 3:
                raise ValueError("cel.bind takes three arguments: (name, init, body)")
            name, init, body = (a.strip() for a in args)
            out.append(f"[{rewrite_bind(init)}].map({name}, {rewrite_bind(body)})[0]")
            i = end
            continue
        out.append(c)
        i += 1
    return "".join(out)


# --- what an expression reads of the device -------------------------------------------------------------

_LITERAL = r"(?:\"([^\"\\]*)\"|'([^'\\]*)')"
_DEVICE_USE = re.compile(r"(?<![\w.])device\b")
_DRIVER_USE = re.compile(r"\.\s*driver\b")
_MAP_USE = re.compile(r"\.\s*(attributes|capacity)\s*\[\s*" + _LITERAL + r"\s*\]")
_FIELD_USE = re.compile(r"\s*(?:\.\s*([A-Za-z_]\w*)\b(?!\s*\()|\[\s*" + _LITERAL + r"\s*\])")
_IN_BEFORE = re.compile(r"\bin\s*$")
Reference = tuple[str, str, str | None]  # (attributes|capacity, domain, identifier or None for the key set)


def device_references(expression: str) -> frozenset[Reference] | None:
    """Everything the expression reads of `device`, when that is statically clear; else None.

    Clear means: `device.driver`, `device.attributes["dom"].id` / `["dom"]["id"]` (and the same for capacity),
    or `x in device.attributes["dom"]` (then the domain's key set counts). Anything else (iteration, size(),
    cel.bind, computed keys) may read any part of the device.
    """
    if "\\" in expression:
        return None
    # Blank out string literals so that "device" inside a string is not taken for a use.
    masked = re.sub(_LITERAL, lambda m: '"' + "_" * (len(m.group(0)) - 2) + '"', expression)
    refs: set[Reference] = set()
    for use in _DEVICE_USE.finditer(masked):
        end = use.end()
        if _DRIVER_USE.match(masked, end):
            continue
        m = _MAP_USE.match(expression, end)
        if not m:
            return None
        kind, domain = m.group(1), m.group(2) if m.group(2) is not None else m.group(3)
        f = _FIELD_USE.match(expression, m.end())
        if f:
            ident = f.group(1) or (f.group(2) if f.group(2) is not None else f.group(3))
            refs.add((kind, domain, ident))
        elif _IN_BEFORE.search(masked[:use.start()]):
            refs.add((kind, domain, None))
        else:
            return None
    return frozenset(refs)


# --- compiled selectors and the environment -------------------------------------------------------------

@dataclass(frozen=True)
class Selector:
    """One compiled CEL selector and where it came from (for error messages)."""

    expression: str
    where: str  # "file: Kind ns/name: field.path"
    program: cel.Program
    domains: frozenset[str]
    functions: frozenset[str]
    references: frozenset[Reference] | None  # what it reads of the device (None: possibly anything)


def _short_error(exc: Exception) -> str:
    """The library's message on one line; it quotes the expression, so it is cut (errors.shown)."""
    text = str(exc)
    text = re.sub(r"^Failed to parse expression '.*?': ", "", text, flags=re.S)
    return shown(" ".join(text.split()), 2 * ECHO_LIMIT, quoted=False)


class CelEnvironment:
    """Compiles selectors once (per expression text) and evaluates them on devices."""

    def __init__(self) -> None:
        self._programs: dict[str, tuple] = {}
        self.domains: set[str] = set()
        self.functions: set[str] = set()
        self.generation = 0  # bumped when device contexts built earlier lack a domain or function

    def compile(self, expression: object, where: str) -> Selector:
        """Compile a selector expression; bad input raises UserError naming file, object and field."""
        if not isinstance(expression, str) or not expression.strip():
            raise UserError(f"{where}: must be a non-empty CEL expression string")
        length = len(expression.encode("utf-8", "surrogatepass"))
        if length > MAX_EXPRESSION_LENGTH:
            # The API server's words (pkg/apis/resource/validation: field.TooLong), with the size it has.
            raise UserError(f"{where}: Too long: may not be more than {MAX_EXPRESSION_LENGTH} bytes "
                            f"(it has {length}); shorten the expression")
        cached = self._programs.get(expression)
        if cached is None:
            try:
                rewritten = rewrite_bind(expression)
                program = cel.compile(rewritten)
            except (ValueError, RuntimeError) as exc:
                raise UserError(f"{where}: syntax error: {_short_error(exc)}") from None
            bound = set(_COMPREHENSION_VAR.findall(rewritten))
            undeclared = sorted(set(program.variables()) - bound - {"device"})
            if undeclared:
                raise UserError(f"{where}: undeclared reference to {', '.join(undeclared)!s} "
                                "(the only variable of a device selector is `device`)")
            named = {f for f in program.functions() if f[:1].isalpha()}
            unknown = sorted(named - _NATIVE_FUNCTIONS - set(_FUNCTIONS))
            if unknown:
                raise UserError(f"{where}: unknown function {', '.join(unknown)} in a device selector")
            domains = frozenset(a or b for a, b in _DOMAIN_INDEX.findall(expression))
            cached = (program, domains, frozenset(named & set(_FUNCTIONS)), device_references(expression),
                      estimated_cost(rewritten))
            self._programs[expression] = cached
        program, domains, functions, references, cost = cached
        if cost > MAX_COST:
            # The API server refuses it (pkg/apis/resource/validation: validateCELSelector); the CEL library
            # here cannot stop an evaluation, so running it could take hours.
            estimate = "unbounded" if cost == math.inf else f"{int(cost)}"
            raise UserError(f"{where}: Forbidden: too complex, exceeds cost limit (estimated cost {estimate}, "
                            f"the limit is {MAX_COST}); iterate over fewer or smaller lists")
        if not domains <= self.domains or not functions <= self.functions:
            # A device context built before this selector lacks its domains or functions.
            self.domains |= domains
            self.functions |= functions
            self.generation += 1
        return Selector(expression, where, program, domains, functions, references)

    def context(self, driver: str, attributes: dict[str, AttributeValue], capacity: dict[str, str]) -> cel.Context:
        """The evaluation context of one device (callers cache it per device and `generation`)."""
        variable = device_variable(driver, attributes, capacity, self.domains)
        return cel.Context({"device": variable}, {name: _FUNCTIONS[name] for name in self.functions})

    @staticmethod
    def evaluate(selector: Selector, ctx: cel.Context) -> bool:
        """True/False for a device; SelectorRuntimeError for an evaluation error."""
        try:
            result = selector.program.execute(ctx)
        except KeyError as exc:
            raise SelectorRuntimeError(f"no such key: {exc.args[0]}") from None
        except (RuntimeError, TypeError, ValueError) as exc:
            raise SelectorRuntimeError(_short_error(exc)) from None
        if not isinstance(result, bool):
            raise SelectorRuntimeError(f"the expression returned {type(result).__name__}, a selector must return bool")
        return result


def _cel_attribute(value: AttributeValue) -> object:
    if isinstance(value, Version):
        return semver_value(value.value)
    return value


def device_variable(driver: str, attributes: dict[str, AttributeValue], capacity: dict[str, str],
                    extra_domains: set[str] | frozenset[str] = frozenset()) -> dict:
    """The `device` variable: domain-keyed maps, unqualified keys in the driver's domain."""
    attrs: dict[str, dict] = {d: {} for d in extra_domains}
    for key, value in attributes.items():
        domain, _, ident = key.rpartition("/")
        attrs.setdefault(domain or driver, {})[ident] = _cel_attribute(value)
    caps: dict[str, dict] = {d: {} for d in extra_domains}
    for key, value in capacity.items():
        domain, _, ident = key.rpartition("/")
        caps.setdefault(domain or driver, {})[ident] = quantity_value(value)
    return {"driver": driver, "attributes": attrs, "capacity": caps}
