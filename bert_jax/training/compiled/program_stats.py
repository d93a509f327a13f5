"""What an optimised XLA program does per step, read from its text: its kernels and the bytes they move.

`analyze(compiled.as_text())` walks the entry computation of the program `jax.jit(...).lower(...).compile()`
gives (GPU or TPU), descending into `while` bodies (times their known trip count), `call`s and
`conditional`s, and counts every top-level instruction that launches work as one kernel: fusions, custom
calls (cuBLAS / cuDNN / Pallas), copies, collectives and any unfused operation. Parameters, tuples,
get-tuple-element, bitcasts, constants and the `-done` halves of asynchronous pairs launch nothing.

A kernel's bytes are its operands' and its results' array sizes (for an asynchronous `-start`, its operands
and the first element of its result, the destination; an operand given twice counts once, and one its output
aliases, written in place, counts as the output): what it reads and writes once, per memory space (the
`S(n)` of a TPU layout; HBM is space 0). This is the roofline's memory term, the traffic the program's
kernels cannot avoid if each reads its inputs once and writes its outputs once; caches can cut it, kernels
that re-read a tile add to it. `cost_analysis()` gives no byte count for GPU programs, so this is the one
count both platforms share.

Each kernel is attributed to the pass it comes from by its `op_name` metadata (its own, or for a fusion XLA
made without one, the first of its fused instructions'): "backward" (under JAX's `transpose(...)`), "forward"
(under `jvp(...)`), "update" (every other name: the optimizer, gradient norms, the step counter) or
"unattributed" (no name at all, e.g. a copy XLA inserted).
"""

from __future__ import annotations

import collections
import dataclasses
import re

# Bytes per element of XLA's primitive types (s4 / u4 packed two to a byte).
ELEMENT_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                 "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1,
                 "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e3m4": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5}
ARRAY = re.compile(r"\b(" + "|".join(sorted(ELEMENT_BYTES, key=len, reverse=True)) + r")\[([\d,]*)\](\{[^}]*\})?")
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all", "opt-barrier", "partition-id",
        "replica-id", "add-dependency", "domain", "iota"}
NESTED = {"while", "call", "conditional"}
GEMM_KINDS = {"cublas_gemm", "triton_gemm", "cudnn_gemm"}


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of an instruction's shape: dtype name (XLA's, e.g. "bf16"), dims, bytes, memory space (0: HBM)."""

    dtype: str
    dims: tuple[int, ...]
    nbytes: float
    space: int


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One launched instruction: its name, kind (`kind_of`), pass ("forward" | "backward" | "update" |
    "unattributed"), bytes
    read and written per memory space ({space: bytes}), how many times a step runs it, and for matrix
    multiplications the dtypes of the dot's two operands (else ())."""

    name: str
    kind: str
    phase: str
    bytes_by_space: dict[int, float]
    count: int
    op_name: str
    dot_dtypes: tuple[str, ...] = ()

    @property
    def hbm_bytes(self) -> float:
        return self.bytes_by_space.get(0, 0.0) * self.count


@dataclasses.dataclass
class ProgramStats:
    """The per-step totals of `analyze`: `kernels` (one entry per launch site, with its count per step)."""

    kernels: list[Kernel]

    @property
    def kernel_launches(self) -> int:
        """Kernels run per step (a while body's kernels once per iteration)."""
        return sum(k.count for k in self.kernels)

    @property
    def hbm_bytes(self) -> float:
        """Bytes the kernels read and write in HBM (memory space 0) per step."""
        return sum(k.hbm_bytes for k in self.kernels)

    def by(self, field: str) -> dict[str, tuple[int, float]]:
        """{value of Kernel.<field> (e.g. "kind", "phase"): (kernels per step, HBM bytes per step)}, largest first."""
        table = collections.defaultdict(lambda: [0, 0.0])
        for k in self.kernels:
            row = table[getattr(k, field)]
            row[0] += k.count
            row[1] += k.hbm_bytes
        return {key: (n, b) for key, (n, b) in sorted(table.items(), key=lambda kv: -kv[1][1])}

    def bytes_by_space(self) -> dict[int, float]:
        """{memory space: bytes per step} over every space the program's kernels touch (0: HBM; TPU S(1): VMEM)."""
        total = collections.Counter()
        for k in self.kernels:
            for space, nbytes in k.bytes_by_space.items():
                total[space] += nbytes * k.count
        return dict(sorted(total.items()))

    def recomputed(self) -> tuple[int, int]:
        """(kernels, matrix multiplications among them) per step that XLA's rematerialisation added to fit the memory
        it was given: instructions it cloned, named "<original>.remat" (its `HloRematerialization` pass). A GEMM among
        them is FLOPs the model does not count."""
        kernels = [k for k in self.kernels if ".remat" in k.name]
        gemms = sum(k.count for k in kernels if k.kind in GEMM_KINDS or k.dot_dtypes)
        return sum(k.count for k in kernels), gemms

    def count(self, kind: str) -> int:
        """Kernels per step of one kind (`kind_of`), e.g. "pallas" for Pallas / Triton custom calls."""
        return sum(k.count for k in self.kernels if k.kind == kind)


def arrays(shape_text: str) -> list[Array]:
    """The arrays of an HLO shape's text, e.g. "(bf16[8,128]{1,0}, f32[8]{0:S(1)})" -> two `Array`s."""
    out = []
    for dtype, dims, layout in ARRAY.findall(shape_text):
        sizes = tuple(int(d) for d in dims.split(",") if d)
        n = 1
        for d in sizes:
            n *= d
        space = re.search(r"S\((\d+)\)", layout or "")
        out.append(Array(dtype, sizes, n * ELEMENT_BYTES[dtype], int(space.group(1)) if space else 0))
    return out


def kind_of(opcode: str, attributes: str) -> str:
    """A kernel's kind: "pallas" (Pallas / Triton custom calls), "cudnn_attention", "cublas_gemm", "triton_gemm"
    (XLA's Triton GEMM fusions), "cudnn_gemm", "fusion" (XLA's loop / input / output fusions; `analyze` names one
    that holds a dot "fusion (dot)"), "copy", "collective", or the opcode of an unfused operation."""
    if opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', attributes)
        target = target.group(1) if target else ""
        if "triton" in target or target.startswith("tpu_custom_call") or "mosaic" in target.lower():
            return "pallas"
        if target.startswith("__cudnn$fmha") or "fmha" in target:
            return "cudnn_attention"
        if target.startswith("__cublas"):
            return "cublas_gemm"
        return f"custom-call {target}"
    if opcode == "fusion":
        if re.search(r'"kind":"__triton(_nested)?_gemm', attributes) or '"kind":"__triton"' in attributes:
            return "triton_gemm"
        if '"kind":"__cudnn$fusion"' in attributes:
            return "cudnn_gemm"
        return "fusion"
    if opcode in ("copy", "copy-start"):
        return "copy"
    if any(opcode.startswith(c) for c in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                          "collective-permute", "send", "recv")):
        return "collective"
    return opcode


def _phase_of(op_name: str) -> str:
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "update" if op_name else "unattributed"


def _inner_op_name(computations, called: str) -> str:
    """The op_name of a kernel XLA made without one (a reduction it split, a copy it inserted): the first of its
    fused computation's instructions that has one, else ""."""
    for *_, attributes in computations.get(called, []):
        m = re.search(r'op_name="([^"]+)"', attributes)
        if m:
            return m.group(1)
    return ""


def _operands(rest: str) -> tuple[list[str], str]:
    """The operand names of an instruction (the text after its opcode's "(") and the attribute text after them."""
    depth = 1
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return re.findall(r"%([\w.\-]+)", rest[:i]), rest[i + 1:]
    return re.findall(r"%([\w.\-]+)", rest), ""


def parse(text: str) -> dict[str, list[tuple[str, str, str, list[str], str]]]:
    """HLO module text -> {computation name: [(name, shape text, opcode, operand names, attributes)]}, the entry
    computation under the key "ENTRY" as well as its own name."""
    computations, current = {}, None
    for line in text.splitlines():
        if current is None:
            m = COMPUTATION.match(line)
            if m:
                current = []
                computations[m.group(2)] = current
                if m.group(1):
                    computations["ENTRY"] = current
            continue
        if line.startswith("}"):
            current = None
            continue
        m = INSTRUCTION.match(line)
        if m:
            name, shape, opcode, rest = m.groups()
            operands, attributes = _operands(rest)
            current.append((name, shape, opcode, operands, attributes))
    return computations


def _dot_dtypes(computations, called: str | None, operands: list[str], shapes: dict[str, str]) -> tuple[str, ...]:
    """The operand dtypes of the matrix product a kernel computes: of the `dot` (or `convolution`) inside its fused
    computation, of a cuBLAS call's first two operands (`called` None), or () where it computes none."""
    if called is None:
        return tuple(a.dtype for op in operands[:2] for a in arrays(shapes.get(op, ""))[:1])
    inner = {name: shape for name, shape, *_ in computations.get(called, [])}
    for name, shape, opcode, ops, _ in computations.get(called, []):
        if opcode in ("dot", "convolution"):
            return tuple(a.dtype for op in ops[:2] for a in arrays(inner.get(op, ""))[:1])
    return ()


def _aliasing(attributes: str) -> str:
    """The text of an instruction's output_to_operand_aliasing={...} attribute ("" without one)."""
    start = attributes.find("output_to_operand_aliasing={")
    if start < 0:
        return ""
    depth, i = 0, start + len("output_to_operand_aliasing=")
    for j in range(i, len(attributes)):
        depth += attributes[j] == "{"
        depth -= attributes[j] == "}"
        if depth == 0:
            return attributes[i:j + 1]
    return attributes[i:]


def _walk(computations, name: str, count: int, out: list[Kernel]) -> None:
    body = computations.get(name, [])
    shapes = {n: shape for n, shape, *_ in body}
    for n, shape, opcode, operands, attributes in body:
        if opcode in FREE or opcode.endswith("-done"):
            continue
        if opcode in NESTED:
            trips = 1
            if opcode == "while":
                m = re.search(r'"known_trip_count":\{"n":"(\d+)"', attributes)
                trips = int(m.group(1)) if m else 1
                targets = re.findall(r"(?:body|condition)=%?([\w.\-]+)", attributes)
            else:
                targets = re.findall(r"(?:to_apply|calls|branch_computations=\{[^}]*)=?%([\w.\-]+)", attributes)
                targets += re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", attributes)
            for target in dict.fromkeys(targets):
                _walk(computations, target, count * trips, out)
            continue
        written = arrays(shape)
        if opcode.endswith("-start"):
            written = written[:1]
        # Each distinct operand once (a kernel given one buffer several times reads it through different windows),
        # and none that its output aliases (written in place: counted as the output).
        aliased = {int(i) for i in re.findall(r"\((\d+), \{[\d,\s]*\}\)", _aliasing(attributes))}
        read = dict.fromkeys(op for i, op in enumerate(operands) if i not in aliased)
        nbytes = collections.Counter()
        for array in written + [a for op in read for a in arrays(shapes.get(op, ""))]:
            nbytes[array.space] += array.nbytes
        kind = kind_of(opcode, attributes)
        op_name = re.search(r'op_name="([^"]*)"', attributes)
        called = re.search(r"calls=%?([\w.\-]+)", attributes)
        called = called.group(1) if called else ""
        op_name = op_name.group(1) if op_name else _inner_op_name(computations, called)
        dots = ()
        if opcode == "fusion":
            dots = _dot_dtypes(computations, called, operands, shapes)
            kind = "fusion (dot)" if kind == "fusion" and dots else kind
        elif kind == "cublas_gemm" or opcode in ("dot", "convolution"):
            dots = _dot_dtypes(computations, None, operands, shapes)
        out.append(Kernel(n, kind, _phase_of(op_name), dict(nbytes), count, op_name, dots))


def analyze(text: str) -> ProgramStats:
    """The kernels of an optimised HLO module's text (`jax.stages.Compiled.as_text()`), per step.

    Raises:
      ValueError: the text holds no ENTRY computation (not an HLO module).
    """
    computations = parse(text)
    if "ENTRY" not in computations:
        raise ValueError("not an HLO module's text: no ENTRY computation")
    kernels: list[Kernel] = []
    _walk(computations, "ENTRY", 1, kernels)
    return ProgramStats(kernels)


def summary(stats: ProgramStats) -> dict:
    """A JSON-able summary: kernels per step, HBM bytes, and both per kind and per pass."""
    return {"kernels": stats.kernel_launches, "hbm_bytes": stats.hbm_bytes,
            "by_kind": {k: {"kernels": n, "hbm_bytes": b} for k, (n, b) in stats.by("kind").items()},
            "by_pass": {k: {"kernels": n, "hbm_bytes": b} for k, (n, b) in stats.by("phase").items()},
            "bytes_by_space": stats.bytes_by_space()}

