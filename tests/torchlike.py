"""A torch-like stand-in for CI, which does not install torch: CPU tensors over numpy with the few
operations that the book's adapters and the tests' engine-shaped functions use.

Like torch: `from_numpy` shares memory, operators keep the dtype (float32 stays float32), random
draws come from `default_generator`, and a function written against it fails on a numpy array
(`ndarray` has no `softmax`). Unlike torch, no `manual_seed` at module level: an adapter that
used the slow global seeding would fail here.
"""

import numpy as np

float32, float64, int64, long = np.float32, np.float64, np.int64, np.int64


class Generator:
    """torch.Generator's manual_seed, over a numpy generator."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def manual_seed(self, seed):
        """Restart the stream from seed (an integer below 2**64)."""
        self.rng = np.random.default_rng(int(seed))
        return self


default_generator = Generator()
_threads = {"intra-op": 4, "inter-op": 4}  # like torch: the machine's cores until set


def set_num_threads(n):
    """Intra-op threads."""
    _threads["intra-op"] = int(n)


def get_num_threads():
    return _threads["intra-op"]


def set_num_interop_threads(n):
    """Inter-op threads."""
    _threads["inter-op"] = int(n)


def get_num_interop_threads():
    return _threads["inter-op"]


def _array(value):
    """The numpy array behind a Tensor, or value itself."""
    return value.array if isinstance(value, Tensor) else value


def _index(index):
    """A tensor index as numpy's."""
    if isinstance(index, tuple):
        return tuple(_array(i) for i in index)
    return _array(index)


class Tensor:
    """A CPU tensor: a numpy array with torch's method names."""

    __array_priority__ = 1000  # numpy's operators defer to the Tensor's

    def __init__(self, array):
        self.array = np.asarray(array)

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype.type)
    device = "cpu"

    def numpy(self):
        """The array itself (memory shared, as in torch)."""
        return self.array

    def detach(self):
        return self

    def cpu(self):
        return self

    def to(self, dtype=None, device=None):
        return self if dtype is None else Tensor(self.array.astype(dtype))

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    def __repr__(self):
        return f"tensor({self.array!r})"

    def __len__(self):
        return len(self.array)

    def __int__(self):
        return int(self.array)

    def __index__(self):
        return int(self.array)

    def __bool__(self):
        return bool(self.array)

    def item(self):
        return self.array.item()

    def __getitem__(self, index):
        return Tensor(self.array[_index(index)])

    def __setitem__(self, index, value):
        self.array[_index(index)] = _array(value)

    def dim(self):
        return self.array.ndim

    def _apply(self, op, other):
        """op on the arrays, keeping a float32 tensor float32 beside Python numbers."""
        result = op(self.array, _array(other))
        if isinstance(other, int | float) and self.array.dtype.kind == "f":
            result = result.astype(self.array.dtype)
        return Tensor(result)

    def __add__(self, other):
        return self._apply(np.add, other)

    def __radd__(self, other):
        return self._apply(np.add, other)

    def __sub__(self, other):
        return self._apply(np.subtract, other)

    def __rsub__(self, other):
        return self._apply(lambda a, b: b - a, other)

    def __mul__(self, other):
        return self._apply(np.multiply, other)

    def __rmul__(self, other):
        return self._apply(np.multiply, other)

    def __truediv__(self, other):
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._apply(np.true_divide, other)

    def __lt__(self, other):
        return Tensor(self.array < _array(other))

    def __le__(self, other):
        return Tensor(self.array <= _array(other))

    def __ge__(self, other):
        return Tensor(self.array >= _array(other))

    def __eq__(self, other):
        return Tensor(self.array == _array(other))

    def __ne__(self, other):
        return Tensor(self.array != _array(other))

    def __invert__(self):
        return Tensor(~self.array)

    def __and__(self, other):
        return Tensor(self.array & _array(other))

    __hash__ = None

    def softmax(self, dim):
        """exp(x − max) / Σ, in the tensor's dtype; −inf gets 0."""
        z = np.exp(self.array - self.array.max(axis=dim, keepdims=True))
        return Tensor(z / z.sum(axis=dim, keepdims=True))

    def sum(self, dim=None, keepdim=False):
        return Tensor(self.array.sum(axis=dim, keepdims=keepdim))

    def cumsum(self, dim):
        return Tensor(np.cumsum(self.array, axis=dim))

    def cumprod(self, dim):
        return Tensor(np.cumprod(self.array, axis=dim))

    def argmax(self, dim=None):
        return Tensor(self.array.argmax(axis=dim))

    def clamp(self, min=None, max=None):
        return Tensor(np.clip(self.array, min, max).astype(self.array.dtype))

    def div_(self, other):
        self.array /= _array(other)
        return self

    def squeeze(self, *dims):
        return Tensor(self.array.squeeze(axis=dims or None))

    def unsqueeze(self, dim):
        return Tensor(np.expand_dims(self.array, dim))

    def reshape(self, *shape):
        return Tensor(self.array.reshape(*shape))

    def long(self):
        return Tensor(self.array.astype(np.int64))

    def exponential_(self, lambd=1.0):
        """Fill with Exp(lambd) draws from the default generator."""
        self.array[...] = default_generator.rng.exponential(1 / lambd, self.array.shape)
        return self


def from_numpy(array):
    """A tensor sharing array's memory; like torch, only numpy arrays."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    return Tensor(array)


def tensor(data, dtype=None):
    return Tensor(np.array(_array(data), dtype=dtype))


def arange(n):
    return Tensor(np.arange(n))


def rand(*shape, dtype=float32):
    return Tensor(default_generator.rng.random(shape).astype(dtype))


def rand_like(t):
    return Tensor(default_generator.rng.random(t.shape).astype(t.array.dtype))


def empty_like(t):
    return Tensor(np.empty_like(t.array))


def full(shape, value, dtype=int64):
    return Tensor(np.full(shape, value, dtype=dtype))


def where(condition, a, b):
    return Tensor(np.where(_array(condition), _array(a), _array(b)))


def minimum(a, b):
    return Tensor(np.minimum(_array(a), _array(b)))


def cat(tensors, dim=0):
    return Tensor(np.concatenate([_array(t) for t in tensors], axis=dim))


def multinomial(probs, num_samples):
    """One draw per row of probs (n, V), by inverse CDF of its running sum: (n, 1)."""
    assert num_samples == 1
    cumulative = np.cumsum(probs.array.astype(np.float64), axis=-1)
    u = default_generator.rng.random(cumulative.shape[:-1]) * cumulative[..., -1]
    draws = (cumulative <= u[..., None]).sum(axis=-1)
    return Tensor(np.minimum(draws, cumulative.shape[-1] - 1)[..., None])
