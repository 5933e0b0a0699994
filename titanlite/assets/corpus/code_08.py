"""A small dense matrix class with Gaussian elimination.

This is written for clarity rather than speed: rows are plain Python lists of
floats. It supports multiplication, transpose, solving linear systems,
determinants and inverses, using partial pivoting to keep rounding errors in
check.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

EPS = 1e-12


class SingularMatrixError(ArithmeticError):
    pass


class Matrix:
    def __init__(self, rows: Iterable[Sequence[float]]) -> None:
        self.rows: list[list[float]] = [list(map(float, row)) for row in rows]
        if not self.rows or not self.rows[0]:
            raise ValueError("matrix must have at least one element")
        width = len(self.rows[0])
        if any(len(row) != width for row in self.rows):
            raise ValueError("all rows must have the same length")

    # -- construction -------------------------------------------------------
    @classmethod
    def identity(cls, n: int) -> Matrix:
        return cls([[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)])

    @classmethod
    def zeros(cls, n: int, m: int) -> Matrix:
        return cls([[0.0] * m for _ in range(n)])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.rows), len(self.rows[0])

    def copy(self) -> Matrix:
        return Matrix(self.rows)

    # -- basic algebra --------------------------------------------------------
    def transpose(self) -> Matrix:
        return Matrix(zip(*self.rows, strict=True))

    def _pairs(self, other: Matrix) -> Iterator[Iterator[tuple[float, float]]]:
        """Yield each row as (mine, theirs) pairs; shapes must match."""
        if self.shape != other.shape:
            raise ValueError(f"shape mismatch: {self.shape} vs {other.shape}")
        for r, s in zip(self.rows, other.rows, strict=True):
            yield zip(r, s, strict=True)

    def __add__(self, other: Matrix) -> Matrix:
        return Matrix([[a + b for a, b in row] for row in self._pairs(other)])

    def __sub__(self, other: Matrix) -> Matrix:
        return Matrix([[a - b for a, b in row] for row in self._pairs(other)])

    def __matmul__(self, other: Matrix) -> Matrix:
        n, k = self.shape
        k2, m = other.shape
        if k != k2:
            raise ValueError(f"cannot multiply {self.shape} by {other.shape}")
        # Iterating over columns of the transpose keeps the inner loop on rows,
        # which is the cache-friendly order for lists of lists.
        cols = other.transpose().rows
        return Matrix([[sum(a * b for a, b in zip(row, col, strict=True)) for col in cols] for row in self.rows])

    def scale(self, factor: float) -> Matrix:
        return Matrix([[factor * x for x in row] for row in self.rows])

    # -- elimination ------------------------------------------------------------
    def _eliminate(self, rhs: Matrix | None = None) -> tuple[list[list[float]], list[list[float]], int]:
        """Reduce to upper triangular form, applying the same steps to rhs.

        Returns the reduced matrix, the transformed right-hand side and the
        number of row swaps, which flips the sign of the determinant.
        """
        n, m = self.shape
        if n != m:
            raise ValueError("elimination requires a square matrix")
        a = [row[:] for row in self.rows]
        b = [row[:] for row in rhs.rows] if rhs is not None else [[] for _ in range(n)]
        swaps = 0
        for col in range(n):
            # Partial pivoting: choose the largest entry to avoid dividing by
            # a tiny number, which would magnify rounding errors.
            pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
            if abs(a[pivot][col]) < EPS:
                raise SingularMatrixError("matrix is singular or nearly so")
            if pivot != col:
                a[col], a[pivot] = a[pivot], a[col]
                b[col], b[pivot] = b[pivot], b[col]
                swaps += 1
            for r in range(col + 1, n):
                factor = a[r][col] / a[col][col]
                if factor == 0.0:
                    continue
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
                b[r] = [x - factor * y for x, y in zip(b[r], b[col], strict=True)]
        return a, b, swaps

    def determinant(self) -> float:
        try:
            a, _, swaps = self._eliminate()
        except SingularMatrixError:
            return 0.0
        det = -1.0 if swaps % 2 else 1.0
        for i, row in enumerate(a):
            det *= row[i]
        return det

    def solve(self, rhs: Matrix) -> Matrix:
        """Solve self @ X = rhs for X by back substitution."""
        a, b, _ = self._eliminate(rhs)
        n = len(a)
        width = len(b[0])
        x = [[0.0] * width for _ in range(n)]
        for i in reversed(range(n)):
            for j in range(width):
                acc = b[i][j] - sum(a[i][k] * x[k][j] for k in range(i + 1, n))
                x[i][j] = acc / a[i][i]
        return Matrix(x)

    def inverse(self) -> Matrix:
        return self.solve(Matrix.identity(self.shape[0]))

    # -- presentation -------------------------------------------------------------
    def allclose(self, other: Matrix, tol: float = 1e-9) -> bool:
        if self.shape != other.shape:
            return False
        return all(abs(a - b) <= tol for row in self._pairs(other) for a, b in row)

    def __repr__(self) -> str:
        body = "\n ".join("[" + ", ".join(f"{x:8.4f}" for x in row) + "]" for row in self.rows)
        return f"[{body}]"


if __name__ == "__main__":
    a = Matrix([[2, 1, -1], [-3, -1, 2], [-2, 1, 2]])
    b = Matrix([[8], [-11], [-3]])
    x = a.solve(b)
    print("solution x =")
    print(x)
    print("determinant:", round(a.determinant(), 6))
    inv = a.inverse()
    print("A @ inverse(A) is identity:", (a @ inv).allclose(Matrix.identity(3)))
    try:
        Matrix([[1, 2], [2, 4]]).inverse()
    except SingularMatrixError as exc:
        print("singular:", exc)
