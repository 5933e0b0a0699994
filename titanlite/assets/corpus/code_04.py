"""A tiny arithmetic expression evaluator.

The evaluator is split into the classic three stages: a tokenizer that turns
text into tokens, a recursive descent parser that builds a syntax tree, and an
interpreter that walks the tree. Variables and a few math functions are
supported, which is enough for a calculator prompt.

Grammar (lowest to highest precedence)::

    expr    := term (("+" | "-") term)*
    term    := factor (("*" | "/" | "%") factor)*
    factor  := ("+" | "-") factor | power
    power   := atom ("^" factor)?
    atom    := NUMBER | NAME | NAME "(" expr ")" | "(" expr ")"
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

TOKEN_RE = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|([A-Za-z_]\w*)|(.))")

FUNCTIONS: dict[str, Callable[[float], float]] = {
    "sqrt": math.sqrt,
    "sin": math.sin,
    "cos": math.cos,
    "log": math.log,
    "abs": abs,
}


class ParseError(ValueError):
    pass


@dataclass(frozen=True)
class Token:
    kind: str  # "num", "name", "op" or "end"
    text: str
    pos: int


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    source = source.rstrip()
    while pos < len(source):
        match = TOKEN_RE.match(source, pos)
        if match is None:  # only possible for trailing whitespace
            break
        number, name, op = match.groups()
        start = match.start(match.lastindex or 0)
        if number:
            tokens.append(Token("num", number, start))
        elif name:
            tokens.append(Token("name", name, start))
        elif op in "+-*/%^()":
            tokens.append(Token("op", op, start))
        else:
            raise ParseError(f"unexpected character {op!r} at position {start}")
        pos = match.end()
    tokens.append(Token("end", "", len(source)))
    return tokens


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Call:
    func: str
    arg: Node


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Node


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node


Node = Num | Var | Call | Unary | Binary


class Parser:
    def __init__(self, source: str) -> None:
        self.tokens = tokenize(source)
        self.index = 0

    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.current
        self.index += 1
        return token

    def expect(self, text: str) -> None:
        if self.current.text != text:
            raise ParseError(f"expected {text!r} at position {self.current.pos}")
        self.advance()

    def parse(self) -> Node:
        node = self.expr()
        if self.current.kind != "end":
            raise ParseError(f"unexpected {self.current.text!r} at position {self.current.pos}")
        return node

    def expr(self) -> Node:
        node = self.term()
        while self.current.text in ("+", "-"):
            op = self.advance().text
            node = Binary(op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.current.text in ("*", "/", "%"):
            op = self.advance().text
            node = Binary(op, node, self.factor())
        return node

    def factor(self) -> Node:
        if self.current.text in ("+", "-"):
            op = self.advance().text
            return Unary(op, self.factor())
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        if self.current.text == "^":
            self.advance()
            # Recursing into factor makes ^ right-associative: 2^3^2 == 2^9.
            return Binary("^", base, self.factor())
        return base

    def atom(self) -> Node:
        token = self.current
        if token.kind == "num":
            self.advance()
            return Num(float(token.text))
        if token.kind == "name":
            self.advance()
            if self.current.text == "(":
                self.advance()
                arg = self.expr()
                self.expect(")")
                return Call(token.text, arg)
            return Var(token.text)
        if token.text == "(":
            self.advance()
            node = self.expr()
            self.expect(")")
            return node
        raise ParseError(f"unexpected {token.text or 'end of input'!r} at position {token.pos}")


def evaluate(node: Node, env: dict[str, float]) -> float:
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Var):
        if node.name not in env:
            raise NameError(f"unknown variable {node.name!r}")
        return env[node.name]
    if isinstance(node, Call):
        if node.func not in FUNCTIONS:
            raise NameError(f"unknown function {node.func!r}")
        return FUNCTIONS[node.func](evaluate(node.arg, env))
    if isinstance(node, Unary):
        value = evaluate(node.operand, env)
        return -value if node.op == "-" else value
    left = evaluate(node.left, env)
    right = evaluate(node.right, env)
    if node.op == "+":
        return left + right
    if node.op == "-":
        return left - right
    if node.op == "*":
        return left * right
    if node.op == "/":
        return left / right
    if node.op == "%":
        return left % right
    return left ** right


def calc(source: str, env: dict[str, float] | None = None) -> float:
    scope = {"pi": math.pi, "e": math.e}
    scope.update(env or {})
    return evaluate(Parser(source).parse(), scope)


if __name__ == "__main__":
    examples = ["1 + 2 * 3", "(1 + 2) * 3", "-2 ^ 2", "2 ^ 3 ^ 2", "sqrt(16) + x", "10 % 4"]
    for text in examples:
        print(f"{text:<16} = {calc(text, {'x': 0.5}):g}")
