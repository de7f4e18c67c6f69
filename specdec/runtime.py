"""Chapter 9's clock: the same transformer run by ONNX Runtime, behind the same interface.

`TinyTransformer` (transformer.py) is the readable reference, and every exactness check runs on
it. Its timings, though, are largely numpy's per-call dispatch: on a model whose weights sit in
cache, a call costs several times the time needed to read them (chapter 9's roofline).
`RuntimeTransformer` builds the same forward pass as an ONNX graph (with `onnx.helper`, from the
same weights) and runs it in ONNX Runtime on the CPU, one compiled graph a call. The KV cache,
rollback and selection stay in numpy, as in the reference: only `forward` changes hands.

The graph takes, per call, the new ids and their positions (B, n), the whole cache (L, B, S, d)
of keys and of values, and an additive mask (B, 1, n, S + n) that hides the cache past each
row's length and the later new positions; it returns the logits (B, n, V) and the new positions'
keys and values (L, B, n, d), which `forward` writes into the cache.
"""

import functools
import math

import numpy as np

from .transformer import Config, TinyTransformer

RUNTIME_THREADS = 1  # intra-op threads: one, as the reference's BLAS (transformer.BLAS_THREADS)
OPSET = 17  # LayerNormalization is an ONNX operator from opset 17


def _graph(config, weights):
    """The forward pass as an ONNX model (onnx.ModelProto) holding the weights as constants."""
    from onnx import TensorProto, helper, numpy_helper

    embed, position, layers, final_norm, unembed = weights
    d, heads = config.d_model, config.n_heads
    nodes, constants = [], []

    def const(name, array):
        constants.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(kind, inputs, name, **attributes):
        nodes.append(helper.make_node(kind, inputs, [name], name=name, **attributes))
        return name

    def norm(x, pair, name):
        gain, bias = const(f"{name}_gain", pair[0]), const(f"{name}_bias", pair[1])
        return op("LayerNormalization", [x, gain, bias], name, axis=-1, epsilon=1e-5)

    def split_heads(x, name):  # (B, T, d) -> (B, H, T, d/H)
        shaped = op("Reshape", [x, const(f"{name}_shape", [0, -1, heads, d // heads])], name + "r")
        return op("Transpose", [shaped], name, perm=[0, 2, 1, 3])

    f32 = np.float32
    scale, half, one = (
        const("scale", f32(1 / math.sqrt(d // heads))),
        const("half", f32(0.5)),
        const("one", f32(1)),
    )
    cube, root = const("cube", f32(0.044715)), const("root", f32(0.7978845608))
    x = op(
        "Add",
        [
            op("Gather", [const("embed", embed), "ids"], "e"),
            op("Gather", [const("position", position), "pos"], "p"),
        ],
        "x0",
    )
    new_keys, new_values = [], []
    for i, layer in enumerate(layers):
        h = norm(x, layer.ln1, f"l{i}_ln1")
        qkv = op("MatMul", [h, const(f"l{i}_w_qkv", layer.w_qkv)], f"l{i}_qkv")
        q, k, v = (f"l{i}_{c}" for c in "qkv")
        sizes = const(f"l{i}_sizes", [d, d, d])
        nodes.append(helper.make_node("Split", [qkv, sizes], [q, k, v], axis=-1))
        new_keys.append(op("Unsqueeze", [k, const(f"l{i}_axis", [0])], f"l{i}_k1"))
        new_values.append(op("Unsqueeze", [v, f"l{i}_axis"], f"l{i}_v1"))
        index = const(f"l{i}_index", np.int64(i))
        past_k = op("Gather", ["keys", index], f"l{i}_pk", axis=0)  # (B, S, d)
        past_v = op("Gather", ["values", index], f"l{i}_pv", axis=0)
        all_k = split_heads(op("Concat", [past_k, k], f"l{i}_ak", axis=1), f"l{i}_kh")
        all_v = split_heads(op("Concat", [past_v, v], f"l{i}_av", axis=1), f"l{i}_vh")
        keys_t = op("Transpose", [all_k], f"l{i}_kt", perm=[0, 1, 3, 2])
        scores = op("MatMul", [split_heads(q, f"l{i}_qh"), keys_t], f"l{i}_s")
        scores = op("Add", [op("Mul", [scores, scale], f"l{i}_ss"), "mask"], f"l{i}_sm")
        att = op("MatMul", [op("Softmax", [scores], f"l{i}_a", axis=-1), all_v], f"l{i}_o")
        merged = op("Transpose", [att], f"l{i}_ot", perm=[0, 2, 1, 3])
        merged = op("Reshape", [merged, const(f"l{i}_merge", [0, 0, d])], f"l{i}_om")
        x = op(
            "Add",
            [x, op("MatMul", [merged, const(f"l{i}_w_o", layer.w_o)], f"l{i}_wo")],
            f"l{i}_x1",
        )
        u = op(
            "MatMul", [norm(x, layer.ln2, f"l{i}_ln2"), const(f"l{i}_w_up", layer.w_up)], f"l{i}_u"
        )
        u3 = op("Mul", [op("Mul", [u, u], f"l{i}_u2"), u], f"l{i}_u3")
        inner = op(
            "Mul", [op("Add", [u, op("Mul", [u3, cube], f"l{i}_c")], f"l{i}_g0"), root], f"l{i}_g1"
        )
        gelu = op(
            "Mul",
            [
                op("Mul", [u, half], f"l{i}_g2"),
                op("Add", [one, op("Tanh", [inner], f"l{i}_g3")], f"l{i}_g4"),
            ],
            f"l{i}_g",
        )
        down = op("MatMul", [gelu, const(f"l{i}_w_down", layer.w_down)], f"l{i}_dn")
        x = op("Add", [x, down], f"l{i}_x2")
    logits = op("MatMul", [norm(x, final_norm, "final"), const("unembed", unembed)], "logits")
    op("Concat", new_keys, "new_keys", axis=0)
    op("Concat", new_values, "new_values", axis=0)

    def tensor(name, kind, shape):
        return helper.make_tensor_value_info(name, kind, shape)

    cache = ["layers", "B", "S", d]
    graph = helper.make_graph(
        nodes,
        "tiny_transformer",
        [
            tensor("ids", TensorProto.INT64, ["B", "n"]),
            tensor("pos", TensorProto.INT64, ["B", "n"]),
            tensor("keys", TensorProto.FLOAT, cache),
            tensor("values", TensorProto.FLOAT, cache),
            tensor("mask", TensorProto.FLOAT, ["B", 1, "n", "T"]),
        ],
        [
            tensor(logits, TensorProto.FLOAT, ["B", "n", config.n_outputs]),
            tensor("new_keys", TensorProto.FLOAT, ["layers", "B", "n", d]),
            tensor("new_values", TensorProto.FLOAT, ["layers", "B", "n", d]),
        ],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _session(model):
    """An ONNX Runtime CPU session of model, on RUNTIME_THREADS threads, fully optimised."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = RUNTIME_THREADS
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@functools.cache  # a few n per run; read-only, shared between calls
def _causal(n):
    """(n, n) float32: 0 where new position j ≤ i may be seen from new position i, else −inf."""
    mask = np.where(np.tri(n, dtype=bool), np.float32(0), np.float32(-np.inf))
    mask.flags.writeable = False
    return mask


class RuntimeTransformer(TinyTransformer):
    """`TinyTransformer` whose forward pass runs in ONNX Runtime: the same weights, cache,
    rollback and selection (inherited), and logits within 2.5e-5 of numpy's (both float32;
    tests/test_runtime.py)."""

    def __init__(self, config, batch=1, weights=None):
        if not isinstance(config, Config):
            raise TypeError(f"config must be a Config, got {type(config).__name__}")
        if config.dtype != "float32":
            raise ValueError(f"the runtime runs float32 models, got dtype {config.dtype!r}")
        super().__init__(config, batch, weights)
        weights = self.embed, self.position, self.layers, self.final_norm, self.unembed
        self.session = _session(_graph(config, weights))

    @classmethod
    def twin(cls, model):
        """The runtime twin of a TinyTransformer: its config and weights, an empty cache."""
        if not isinstance(model, TinyTransformer):
            raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
        weights = model.embed, model.position, model.layers, model.final_norm, model.unembed
        return cls(model.config, 1, weights)

    def forward(self, ids):
        """Logits (B, n, V) for n new ids per sequence (B, n), appended after the cache."""
        ids = self._check_ids(ids)
        batch, n = ids.shape
        span = self.keys.shape[2]
        pos = self.lengths[:, None] + np.arange(n)  # (B, n) absolute positions
        mask = np.empty((batch, 1, n, span + n), np.float32)  # (B, 1, n, S + n), added to scores
        hidden = np.arange(span) >= self.lengths[:, None]  # (B, S): cache slots past each length
        mask[..., :span] = np.where(hidden, np.float32(-np.inf), np.float32(0))[:, None, None]
        mask[..., span:] = _causal(n)  # a new position sees itself and the earlier new ones
        feed = {
            "ids": ids.astype(np.int64),
            "pos": pos,
            "keys": self.keys,
            "values": self.values,
            "mask": mask,
        }
        logits, new_keys, new_values = self.session.run(None, feed)
        rows = np.arange(batch)[:, None]
        self.keys[:, rows, pos] = new_keys
        self.values[:, rows, pos] = new_values
        self.lengths = self.lengths + n
        return logits
