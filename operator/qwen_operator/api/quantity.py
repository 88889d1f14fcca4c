"""Kubernetes quantities: their value (`value`, `quantity_bytes`), and the form the API server stores
them in (apimachinery's canonical form, `canonical`). The one parser of quantities in the operator.

The server rewrites every quantity it stores: `cpu: "0.5"` comes back as `500m`, `65536Mi` as `64Gi`.
A child rendered with the user's spelling would differ from what the server returns at every look,
and be applied again at every resync; rendered canonical, it matches. The rules are those of
`resource.Quantity.CanonicalizeBytes` (k8s.io/apimachinery/pkg/api/resource/quantity.go): a binary
suffix is kept for integral values of at least 1024 (with the largest power of 1024 that divides the
value), anything else is written in decimal SI with an exponent that is a multiple of 3, trailing
zeros removed; values are rounded up to nano precision, as the parser does.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {power: suffix for suffix, power in _BINARY.items()} | {0: ""}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
_FORM = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")
#: What the API server may also write (status fields, the metrics APIs): a decimal exponent ("1e3").
_EXPONENT = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)[eE]([+-]?[0-9]+)$")


def value(quantity: str | int | float) -> Decimal:
    """The exact value of a quantity: "1500m" -> 1.5, "94Gi" -> 100931731456, "1e3" -> 1000.

    Raises ValueError for text that is not a quantity."""
    text = str(quantity)
    exponent = _EXPONENT.match(text)
    if exponent is not None:
        return Decimal(exponent.group(1)).scaleb(int(exponent.group(2)))
    match = _FORM.match(text)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    with localcontext() as ctx:
        ctx.prec = 60
        if suffix in _BINARY:
            return Decimal(number) * Decimal(1024) ** _BINARY[suffix]
        return Decimal(number).scaleb(_DECIMAL[suffix])


def quantity_bytes(quantity: str) -> int:
    """A quantity of bytes (already matched by the CRD's pattern) as a whole number: `19.5G`, `94Gi`."""
    return int(value(quantity))


def canonical(quantity: str | int | float) -> str:
    """`quantity` as the API server would store it: "0.5" -> "500m", "65536Mi" -> "64Gi", "1000" -> "1k".

    Raises ValueError for text that is not a quantity (exponent forms such as "1e3" are not handled:
    the CRD's pattern refuses them)."""
    text = str(quantity)
    if _FORM.match(text) is None:  # the API server's own exponent forms are not written by a user
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    binary = text.endswith(tuple(_BINARY))
    with localcontext() as ctx:
        ctx.prec = 60
        exact = value(text).quantize(Decimal("1e-9"), rounding=ROUND_CEILING)
        if exact == 0:
            return "0"
        if binary and abs(exact) >= 1024 and exact == exact.to_integral_value():
            return _base1024(int(exact))
        return _decimal_si(exact)


def _base1024(value: int) -> str:
    power = 0
    while value % 1024 == 0 and power < max(_BINARY.values()):
        value //= 1024
        power += 1
    return f"{value}{_BINARY_SUFFIX[power]}"


def _decimal_si(value: Decimal) -> str:
    sign, digits, exponent = value.normalize().as_tuple()
    assert isinstance(exponent, int)
    mantissa = int("".join(map(str, digits)))
    shift = exponent % 3  # Python's modulo is never negative: -1 -> 2, as apimachinery's case -1
    mantissa, exponent = mantissa * 10**shift, exponent - shift
    text = f"{'-' if sign else ''}{mantissa}"
    if exponent in _DECIMAL_SUFFIX:
        return text + _DECIMAL_SUFFIX[exponent]
    return f"{text}e{exponent}"
