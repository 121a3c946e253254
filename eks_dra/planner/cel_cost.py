"""Worst-case cost of a DRA device selector, estimated before it runs (the API server's check, which the CEL
library lacks: it has no cost budget and cannot be interrupted).

The API server refuses a selector whose estimated cost is over `CELSelectorExpressionMaxCost`
(k8s.io/api/resource/v1; k8s.io/dynamic-resource-allocation/cel/compile.go estimates it with cel-go's
`checker.CostEstimator`). This is that estimate in small: it parses the expression, gives every value a
worst-case size (a string's length, a list's or map's entries) from the limits of a device (below) and of
literals, and charges cel-go's unit costs: 1 per identifier, field, index and call, 10 per list and 30 per map
literal, a tenth per character a string function reads, and for a comprehension its range's size times the cost
of one step. A size it cannot bound (a function it does not know) is unbounded, as in cel-go, so iterating over
it is over any limit. It is an estimate of the same order as the API server's, not its exact figure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_COST = 1_000_000  # CELSelectorExpressionMaxCost
# k8s.io/api/resource/v1: the most a device can hold.
DEVICE_MAX_DOMAIN_LENGTH = 63  # DeviceMaxDomainLength
DEVICE_MAX_ID_LENGTH = 32  # DeviceMaxIDLength
DRIVER_NAME_MAX_LENGTH = 63  # DriverNameMaxLength
DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength
MAX_ATTRIBUTES_PER_DEVICE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
# cel-go common/cost.go
_STRING_TRAVERSAL = 0.1
_REGEX_FACTOR = 0.25
_LIST_CREATE, _MAP_CREATE, _STRUCT_CREATE = 10, 30, 40
_STEP_BOOL, _STEP_LIST = 3, 13  # per iteration: the accumulator's condition and update (and list append)
INF = math.inf


@dataclass(frozen=True)
class _Est:
    """A value's worst case: the cost to compute it, its size, and what indexing and iterating it yield."""

    cost: float = 0
    size: float = 1
    elem: _Est | None = None  # a list's elements or a map's values
    key: _Est | None = None  # what a comprehension binds: a list's elements or a map's keys
    fields: dict[str, _Est] = field(default_factory=dict)

    def costing(self, cost: float) -> _Est:
        return _Est(cost, self.size, self.elem, self.key, self.fields)


_UNKNOWN = _Est(0, INF)
_SCALAR = _Est()


def _string(size: float) -> _Est:
    return _Est(0, size)


def _elem(e: _Est) -> _Est:
    return e.elem or _UNKNOWN


def _key(e: _Est) -> _Est:
    return e.key or e.elem or _UNKNOWN


def _times(n: float, cost: float) -> float:
    return 0 if n == 0 or cost == 0 else n * cost


def _join(values: list[_Est]) -> _Est | None:
    """The worst of several values (a list literal's element type)."""
    if not values:
        return None
    return _Est(0, max(v.size for v in values), _join([v.elem for v in values if v.elem]),
                _join([v.key for v in values if v.key]))


def _device() -> _Est:
    def domain_map(value: _Est) -> _Est:
        inner = _Est(0, MAX_ATTRIBUTES_PER_DEVICE, value, _string(DEVICE_MAX_ID_LENGTH))
        return _Est(0, MAX_ATTRIBUTES_PER_DEVICE, inner, _string(DEVICE_MAX_DOMAIN_LENGTH))
    return _Est(0, 3, fields={
        "driver": _string(DRIVER_NAME_MAX_LENGTH),
        "allowMultipleAllocations": _SCALAR,
        "attributes": domain_map(_string(DEVICE_ATTRIBUTE_MAX_VALUE_LENGTH)),
        "capacity": domain_map(_SCALAR),
    })


_DEVICE = _device()
_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<op>\|\||&&|==|!=|<=|>=|\.\?|\[\?|[-+*/%<>!?:.,()\[\]{}])
""", re.X)
_BINARY = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "in": 3,
           "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}
_SAME_STRING = frozenset({"lowerAscii", "upperAscii", "trim", "reverse", "substring", "charAt"})
_SCANS = frozenset({"contains", "startsWith", "endsWith", "indexOf", "lastIndexOf", "isQuantity", "isSemver",
                    "quantity", "semver", "timestamp", "duration", "sum", "min", "max", "isSorted"})


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"unexpected character at {pos}")
            pos = m.end()
            if m.lastgroup != "space":
                self.tokens.append((m.lastgroup or "", m.group()))
        self.tokens.append(("end", ""))
        self.i = 0
        self.scope: list[dict[str, _Est]] = [{"device": _DEVICE}]

    def peek(self) -> str:
        return self.tokens[self.i][1]

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.tokens[self.i]
        if expected is not None and token[1] != expected:
            raise ValueError(f"expected {expected!r}")
        self.i += 1
        return token

    # -- grammar: expr = binary ['?' binary ':' expr] ----------------------------------------------
    def expr(self) -> _Est:
        cond = self.binary()
        if self.peek() != "?":
            return cond
        self.take("?")
        then = self.binary()
        self.take(":")
        other = self.expr()
        worse = then if then.cost >= other.cost else other
        return _Est(cond.cost + worse.cost, max(then.size, other.size), _join([v for v in (then.elem, other.elem)
                                                                                 if v]), worse.key)

    def binary(self) -> _Est:
        """Operators by precedence, with an explicit stack (no recursion per operator)."""
        values, ops = [self.unary()], []
        while self.peek() in _BINARY:
            op = self.take()[1]
            while ops and _BINARY[ops[-1]] >= _BINARY[op]:
                right, left = values.pop(), values.pop()
                values.append(self.apply(ops.pop(), left, right))
            ops.append(op)
            values.append(self.unary())
        while ops:
            right, left = values.pop(), values.pop()
            values.append(self.apply(ops.pop(), left, right))
        return values[0]

    @staticmethod
    def apply(op: str, a: _Est, b: _Est) -> _Est:
        cost = a.cost + b.cost
        if op in ("&&", "||"):
            return _Est(cost)
        if op == "in":
            return _Est(cost + 1 + b.size)
        if op in ("==", "!=", "<", "<=", ">", ">="):
            return _Est(cost + 1 + _STRING_TRAVERSAL * min(a.size, b.size))
        if op == "+":  # a number, a string or a list: its size is the sum
            return _Est(cost + 1 + _STRING_TRAVERSAL * (a.size + b.size), a.size + b.size,
                        _join([v for v in (a.elem, b.elem) if v]), _join([v for v in (a.key, b.key) if v]))
        return _Est(cost + 1)

    def unary(self) -> _Est:
        ops = 0
        while self.peek() in ("!", "-"):
            self.take()
            ops += 1
        value = self.member()
        return value.costing(value.cost + ops) if ops else value

    def member(self) -> _Est:
        value, name = self.primary()
        while True:
            tok = self.peek()
            if tok in (".", ".?"):
                self.take()
                attr = self.take()[1]
                if self.peek() == "(":
                    value = self.call(attr, value)
                else:
                    picked = value.fields.get(attr) if value.fields else _elem(value)
                    value = (picked or _UNKNOWN).costing(value.cost + 1)
                name = None
            elif tok in ("[", "[?"):
                self.take()
                index = self.expr()
                self.take("]")
                value = _elem(value).costing(value.cost + index.cost + 1)
                name = None
            elif tok == "{" and name is not None:  # a message literal Type{field: value}
                entries = self.entries("}")
                value = _Est(_STRUCT_CREATE + sum(k.cost + v.cost for k, v in entries))
                name = None
            else:
                return value

    def bound(self) -> dict[str, _Est]:
        merged: dict[str, _Est] = {}
        for frame in self.scope:
            merged.update(frame)
        return merged

    def entries(self, close: str) -> list[tuple[_Est, _Est]]:
        out = []
        self.take("{")
        while self.peek() != close:
            key = self.expr()
            self.take(":")
            out.append((key, self.expr()))
            if self.peek() != ",":
                break
            self.take(",")
        self.take(close)
        return out

    def arguments(self) -> list[_Est]:
        out = []
        self.take("(")
        while self.peek() != ")":
            out.append(self.expr())
            if self.peek() != ",":
                break
            self.take(",")
        self.take(")")
        return out

    def primary(self) -> tuple[_Est, str | None]:
        kind, text = self.take()
        if kind == "string":
            body = text.lstrip("rRbB")
            quote = 3 if body[:3] in ("'''", '"""') else 1
            return _string(max(len(body) - 2 * quote, 0)), None
        if kind == "number":
            return _SCALAR, None
        if kind == "ident":
            if text in ("true", "false", "null"):
                return _SCALAR, None
            if self.peek() == "(":
                return self.call(text, None), None
            variable = self.bound().get(text)
            return (variable or _UNKNOWN).costing(1), text
        if text == ".":  # a leading-dot (root-scoped) name
            return self.primary()
        if text == "(":
            inner = self.expr()
            self.take(")")
            return inner, None
        if text == "[":
            items = []
            while self.peek() != "]":
                if self.peek() == "?":
                    self.take()
                items.append(self.expr())
                if self.peek() != ",":
                    break
                self.take(",")
            self.take("]")
            elem = _join(items)
            return _Est(_LIST_CREATE + sum(v.cost for v in items), len(items), elem, elem), None
        if text == "{":
            self.i -= 1
            entries = self.entries("}")
            return _Est(_MAP_CREATE + sum(k.cost + v.cost for k, v in entries), len(entries),
                        _join([v for _, v in entries]), _join([k for k, _ in entries])), None
        raise ValueError(f"unexpected {text!r}")

    # -- calls ----------------------------------------------------------------------------------------
    def call(self, fn: str, target: _Est | None) -> _Est:
        if target is not None and fn in ("all", "exists", "exists_one", "map", "filter"):
            return self.comprehension(fn, target)
        args = self.arguments()
        if target is not None:
            args = [target, *args]
        cost = 1 + sum(a.cost for a in args)
        first = args[0] if args else _SCALAR
        if fn in ("size", "has", "int", "uint", "double", "bool", "type", "first", "last") or fn.startswith("get") or fn in ("isGreaterThan", "isLessThan", "compareTo", "sign", "isInteger",
                                                 "asInteger", "asApproximateFloat", "add", "sub", "major", "minor",
                                                 "patch"):
            return _key(first).costing(cost) if fn in ("first", "last") else _Est(cost)
        if fn in _SCANS:
            return _Est(cost + _STRING_TRAVERSAL * sum(a.size for a in args) + (first.size if fn in (
                "sum", "min", "max", "isSorted") else 0))
        if fn == "matches":
            return _Est(cost + _REGEX_FACTOR * first.size * (args[1].size if len(args) > 1 else 1))
        if fn in _SAME_STRING or fn in ("dyn", "string", "bytes", "sort", "distinct", "slice"):
            size = first.size
            scan = first.size * max(1.0, math.log2(first.size)) if fn in ("sort", "distinct") and first.size > 1 \
                else _STRING_TRAVERSAL * size
            return _Est(cost + scan, size, first.elem, first.key)
        if fn == "replace" and len(args) >= 3:
            size = (first.size + 1) * (args[2].size + 1)
            return _Est(cost + _STRING_TRAVERSAL * size, size)
        if fn == "split":
            return _Est(cost + _STRING_TRAVERSAL * first.size, first.size + 1, _string(first.size),
                        _string(first.size))
        if fn == "join":
            size = first.size * (_key(first).size + (args[1].size if len(args) > 1 else 0))
            return _Est(cost + _STRING_TRAVERSAL * size, size)
        if fn == "flatten":
            inner = _key(first)
            return _Est(cost + first.size * inner.size, first.size * inner.size, _key(inner), _key(inner))
        return _Est(cost, INF)  # a function whose result this estimate cannot bound

    def comprehension(self, fn: str, target: _Est) -> _Est:
        self.take("(")
        variable = self.take()[1]
        self.take(",")
        self.scope.append({variable: _key(target)})
        try:
            steps = [self.expr()]
            while self.peek() == ",":
                self.take(",")
                steps.append(self.expr())
            self.take(")")
        finally:
            self.scope.pop()
        step = sum(s.cost for s in steps)
        if fn in ("map", "filter"):
            cost = target.cost + _times(target.size, step + _STEP_LIST)
            out = steps[-1] if fn == "map" else _key(target)
            return _Est(cost, target.size, out, out)
        return _Est(target.cost + _times(target.size, step + _STEP_BOOL))


def estimated_cost(expression: str) -> float:
    """The worst-case cost of a selector that the CEL library compiled; math.inf when it cannot be bounded
    (or the expression is nested too deeply to estimate)."""
    try:
        parser = _Parser(expression)
        return parser.expr().cost
    except (ValueError, IndexError, RecursionError):
        return INF
