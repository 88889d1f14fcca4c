"""Kubernetes quantities in the form the API server stores them (apimachinery's canonical form).

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


def canonical(quantity: str | int | float) -> str:
    """`quantity` as the API server would store it: "0.5" -> "500m", "65536Mi" -> "64Gi", "1000" -> "1k".

    Raises ValueError for text that is not a quantity (exponent forms such as "1e3" are not handled:
    the CRD's pattern refuses them)."""
    text = str(quantity)
    match = _FORM.match(text)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    with localcontext() as ctx:
        ctx.prec = 60
        if suffix in _BINARY:
            value = Decimal(number) * Decimal(1024) ** _BINARY[suffix]
        else:
            value = Decimal(number).scaleb(_DECIMAL[suffix])
        value = value.quantize(Decimal("1e-9"), rounding=ROUND_CEILING)
        if value == 0:
            return "0"
        if suffix in _BINARY and abs(value) >= 1024 and value == value.to_integral_value():
            return _base1024(int(value))
        return _decimal_si(value)


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
