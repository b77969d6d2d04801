"""Bounds written as arithmetic over numbers and reference names, parsed safely.

`min = "0.5 * demosonly"` must mean what a reader of the pre-registration thinks it means, and nothing
else: the text is parsed with `ast` and only numbers, reference names, + - * / and parentheses are
accepted. Nothing is ever passed to `eval`.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

# An immutable expression tree: ("num", value) | ("ref", name) | ("neg", node) | (op, left, right)
Node = tuple

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ExprError(ValueError):
    """The text is not arithmetic over numbers and reference names."""


@dataclass(frozen=True)
class Expr:
    """A parsed bound: its source text (kept verbatim for the record) and its tree."""

    source: str
    tree: Node

    @property
    def names(self) -> frozenset[str]:
        return frozenset(_names(self.tree))

    def evaluate(self, references: Mapping[str, float]) -> float:
        value = evaluate_tree(self.tree, references, float)
        if not math.isfinite(value):
            raise ExprError(f"{self.source!r} evaluates to {value}")
        return value


def parse(source: str | int | float) -> Expr:
    """Parse a bound; a plain number is an expression too."""
    if isinstance(source, bool):
        raise ExprError("a boolean is not a bound")
    if isinstance(source, (int, float)):
        if not math.isfinite(source):
            raise ExprError(f"{source} is not a finite number")
        return Expr(repr(source), ("num", float(source)))
    if not isinstance(source, str) or not source.strip():
        raise ExprError("expected a number or an arithmetic expression")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"not arithmetic: {exc.msg}") from None
    return Expr(source, _convert(tree.body))


def _convert(node: ast.AST) -> Node:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return ("num", float(node.value))
    if isinstance(node, ast.Name):
        return ("ref", node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _convert(node.operand)
        return ("neg", inner) if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return (_BINARY[type(node.op)], _convert(node.left), _convert(node.right))
    raise ExprError(f"only numbers, reference names, + - * / and parentheses are allowed, not {type(node).__name__}")


def _names(node: Node) -> list[str]:
    kind = node[0]
    if kind == "ref":
        return [node[1]]
    if kind == "num":
        return []
    return [n for child in node[1:] for n in _names(child)]


def decimal_of(value: float | int) -> Fraction:
    """A logged float as the decimal it prints as (its shortest repr), exactly."""
    return Fraction(repr(float(value)))


def exact_value(e: Expr, references: Mapping[str, float]) -> Fraction:
    """Evaluate a bound or a scale as an exact rational over the decimals written."""
    return evaluate_tree(e.tree, references, decimal_of)


def evaluate_tree(node: Node, refs: Mapping[str, float], number: Callable[[float], Any]) -> Any:
    """Evaluate with `number` converting every literal and reference (float, or an exact Fraction)."""
    kind = node[0]
    if kind == "num":
        return number(node[1])
    if kind == "ref":
        if node[1] not in refs:
            raise ExprError(f"unknown reference {node[1]!r}")
        return number(refs[node[1]])
    if kind == "neg":
        return -evaluate_tree(node[1], refs, number)
    left, right = evaluate_tree(node[1], refs, number), evaluate_tree(node[2], refs, number)
    if kind == "+":
        return left + right
    if kind == "-":
        return left - right
    if kind == "*":
        return left * right
    if right == 0:
        raise ExprError("division by zero")
    return left / right
