"""FlashInfer's TRT-LLM kernel call in ``TRTLLMHAAttnBackend.forward_decode`` / ``forward_extend``:
one call site that several records repair together (pr28144: the BMM scales; pr31667: the
query's layout on XQA; pr17732: the K/V cache views' strides with one KV head; encoder_only_mask:
the prefill mask; xqa_workspace: fmha_v2's workspace). Standard library only at import.

One wrapper per method and one gate, owned here; records contribute a *repair* each
(``register``): ``needs(backend, layer, q, wrapped)``, a cheap test that may say True where
nothing differs and never False where upstream's arguments differ, and either ``before(backend,
layer, q)``, the query SGLang's method is called with (a repair upstream makes on the method's own
argument: pr31667's packed query), or ``repair(call, kwargs)``, which returns the kernel's keyword
arguments as upstream's change passes them, SGLang's own objects wherever it leaves them (values
the method computes: pr28144's scales, pr17732's K/V views). ``patch`` joins the records of this
site on a method they share (``Hotfix.site``): the wrapper learns which are on from
``joined.hotfixes``, in the order applied (each repairs its own argument), so records compose as
upstream's changes do, each with its own verdict, switch, line, status block and metric (a
record joins only the wrappers of the methods it names: pr31667's ``needs`` is never asked of a
``forward_extend`` call).

A call pays for what it needs. One for which no record on says ``needs`` runs SGLang's method alone.
One that needs only ``before`` repairs gets them and SGLang's method, with no note and no gate. Otherwise the ``before``
repairs are made and SGLang's method called with their query; if a record repairs at the kernel,
the call is noted (the backend, the layer, the query the method is called with, the forward batch,
the records that need to repair it) for its duration, and the module's global ``flashinfer``
becomes the gate if it is not yet (``patch.arm_gates``). The gate passes FlashInfer through, but a
kernel call made by the noted method, or by a function defined in it (0.5.16's to 0.5.18's
``forward_extend`` calls the context kernel from its nested ``_trtllm_context_attn``, twice under
0.5.16's context parallelism), gets each needed record's repair in turn; a repair that cannot
be computed is skipped with its record's warning (that call is then as with that record off). Once
the kernel is called with the repaired arguments, what it raises propagates, as upstream's call
would.

Beyond the two kernels of ``KERNELS``, a record may have the gate treat another kernel the same way
(``register_noted_kernel``: fmha_v2, which SGLang 0.5.19 to 0.5.21 call with ``(q, paged_kv)``
first), and may name a method of the class that calls a kernel for the wrapped methods
(``register_delegate``: 0.5.19's ``_run_fixed_q_len_decode``): its kernel calls inside a noted call
pass with SGLang's arguments and count as the call's kernel call.
"""

import contextvars
import functools
import sys

from .. import logs

CLASS_NAME = "TRTLLMHAAttnBackend"
MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
SITE = "flashinfer-trtllm-kernel-call"
GATED_GLOBAL = "flashinfer"
# FlashInfer's kernels as the backend reaches them: flashinfer.<submodule>.<function>.
KERNELS = {"decode": "trtllm_batch_decode_with_kv_cache", "prefill": "trtllm_batch_context_with_kv_cache"}

_NEEDS = {}  # record name -> needs(backend, layer, q, wrapped)
_REPAIRS = {}  # record name -> repair(call, kwargs): at the kernel call, through the gate
_BEFORE = {}  # record name -> before(backend, layer, q): the query SGLang's method is called with
# (submodule, kernel) -> repair(kwargs): kernels another record repairs from their own arguments
# alone, whatever method calls them (no noted call): fmha_v2's workspace (record xqa_workspace).
_ARGUMENT_REPAIRS = {}
# (submodule, kernel) -> how many positional arguments SGLang's own call passes it: kernels beyond
# ``KERNELS`` whose calls inside a noted call get the needed records' repairs too (fmha_v2, to which
# SGLang 0.5.19 to 0.5.21 pass ``(q, paged_kv)`` first: record encoder_only_mask's mask_mode).
_ALSO_NOTED = {}
_DELEGATES = set()  # register_delegate


def register(name, needs, repair=None, before=None):
    """A record's part of the site (called when its module is imported): ``repair(call, kwargs)``,
    made at the kernel call through the gate (for values the method computes), or ``before(backend,
    layer, q)``, the query SGLang's method is called with instead of its own (for a repair that
    upstream's change makes on the method's own argument: no note, no gate, nothing at the kernel
    call). ``before`` must give the kernel exactly upstream's tensor once SGLang's method has
    prepared it; what it raises skips the repair for that call, with the record's warning.
    ``needs`` is asked only of calls of the methods the record wraps (``Hotfix.method_names``: a
    record joins only their wrappers), so it need not test which method is called."""
    _NEEDS[name] = needs
    if before is not None:
        _BEFORE[name] = before
    else:
        _REPAIRS[name] = repair


def register_argument_repair(submodule, kernel, repair):
    """A kernel of ``flashinfer.<submodule>`` whose calls through the gate get ``repair(kwargs)``
    (the keyword arguments, SGLang's own objects wherever it leaves them), with no call noted:
    for a record whose repair is decided by the arguments themselves (a buffer the record
    allocated). ``repair`` must never raise."""
    _ARGUMENT_REPAIRS[(submodule, kernel)] = repair


def register_delegate(name):
    """A method of the backend class, ``name``, that the wrapped methods call and that calls a kernel
    itself (0.5.19's ``_run_fixed_q_len_decode``, the decode kernel): inside a noted call, its
    kernel calls (and those of the functions it defines) pass through the gate with SGLang's
    arguments, and count as the noted call's kernel call. Only for a kernel call that every record
    of the site leaves as SGLang makes it: their ``classify`` pins the delegate by fingerprint."""
    _DELEGATES.add(name)


def _delegate_codes(backend):
    """The code objects of the delegates as the backend's class holds them (each with its nested
    functions': ``_method_codes``)."""
    found = []  # a list: a set would hash each code object by content
    for name in _DELEGATES:
        found.extend(_method_codes(getattr(type(backend), name, None)) or ())
    return found


def register_noted_kernel(submodule, kernel, positional=0):
    """``flashinfer.<submodule>.<kernel>`` as a kernel whose calls made by a noted method get the
    needed records' ``repair`` (as the two of ``KERNELS`` do); SGLang's own call passes it
    ``positional`` arguments first (one more is someone else's call: stood aside, and said). Where
    a record also repairs it by its arguments (``register_argument_repair``), that repair is made
    first, on every call through the gate, as for a kernel it alone repairs."""
    _ALSO_NOTED[(submodule, kernel)] = positional


class Call:
    """One wrapped call that needs a repair, as the gate needs it."""

    __slots__ = (
        "function",
        "method",
        "backend",
        "q",
        "layer",
        "forward_batch",
        "needed",
        "hotfixes",
        "used",
        "kernel",
        "delegated",
    )

    def __init__(self, function, backend, q, layer, forward_batch, needed, hotfixes):
        self.function, self.method = function, function.__name__  # SGLang's method, as wrapt calls it
        self.backend, self.q, self.layer, self.forward_batch = backend, q, layer, forward_batch
        self.needed = needed  # the records that repair this call at the kernel, in the order applied
        self.hotfixes = hotfixes  # the Hotfix objects of the records on, by name (the gate is armed through them)
        self.used = False  # a kernel call of the method's own got the repairs (further ones: _GatedKernel)
        self.kernel = None  # the name of the kernel being called, once the gate sees the call
        self.delegated = False  # a kernel call made for the method by a delegate (register_delegate) passed


_current_call = contextvars.ContextVar("sglang_hotfix_trtllm_kernel_site_call", default=None)


def _arguments(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    """Binds a call exactly as both methods' parameter lists do (the records pin them by fingerprint)."""
    return self, q, layer, forward_batch


# The parameters a call's five positional arguments fill: keywords naming none of them bind.
_PARAMETERS = frozenset(("self", "q", "k", "v", "layer", "forward_batch"))


def _target(method):
    return "%s.%s.%s" % (MODULE, CLASS_NAME, method)


class _Plan:
    """What a wrapper asks at each call, for the records on (``joined.hotfixes``): their tests in
    the order applied, and which repair before SGLang's method (``before``). Made at the first call
    after the records on change (a new ``hotfixes`` object) and kept on the joined records
    (``joined.derived``): no dictionary lookup per record per call. The records' functions are
    taken as registered when the plan is made: records register when their module is imported,
    before anything is wrapped (a ``register`` made later counts from the next change of the
    records on)."""

    __slots__ = ("hotfixes", "tests", "before")

    def __init__(self, hotfixes):
        self.hotfixes = hotfixes
        self.tests = tuple((name, _NEEDS[name]) for name in hotfixes)
        self.before = {name: _BEFORE[name] for name in hotfixes if name in _BEFORE}


def note_the_call(module, joined, wrapped, instance, args, kwargs):
    """wrapt wrapper of ``forward_decode`` and ``forward_extend`` for the records on
    (``joined.hotfixes``). A call no record needs to repair runs SGLang's method and nothing else.
    A repair made on the method's query (``before``) is made here, and SGLang's method called with
    it; one the gate makes is noted for the gate until the method returns. A call the method
    rejects raises SGLang's own error (binding here fails quietly). The common call, needing
    nothing, costs the plan's identity check, the tests of the records on and one context-variable
    read: every SGLang decode layer runs it."""
    needed = None
    try:
        hotfixes, plan = joined.hotfixes, joined.derived  # one read each: remove() may replace them meanwhile
        if plan is None or plan.hotfixes is not hotfixes:
            plan = joined.derived = _Plan(hotfixes)
        if instance is not None and len(args) > 3:  # SGLang's positional call (RadixAttention -> forward)
            backend, q, layer = instance, args[0], args[3]
        else:
            backend, q, layer, _ = (
                _arguments(*args, **kwargs) if instance is None else _arguments(instance, *args, **kwargs)
            )
        for name, needs in plan.tests:
            if needs(backend, layer, q, wrapped):
                needed = (needed or ()) + (name,)
    except Exception:
        needed = None  # SGLang's method raises its own error, or runs as it would
    if needed is None:
        if _current_call.get() is None:  # _run_unnoted's first test, inline: every layer's call makes it
            return wrapped(*args, **kwargs)
        return _run_unnoted(wrapped, args, kwargs)
    gated = ()
    before = plan.before
    for name in needed:  # in order: a later record sees the query an earlier one gave the method
        repair = before.get(name)
        if repair is None:
            gated += (name,)
            continue
        try:
            q = repair(backend, layer, q)
        except Exception as error:
            logs.repair_skipped(_target(wrapped.__name__), name, error, kind="not-computed")
            continue
        args, kwargs = _with_query(instance, args, kwargs, q)
    if not gated:
        return _run_unnoted(wrapped, args, kwargs)
    if instance is not None and len(args) == 5 and _PARAMETERS.isdisjoint(kwargs):
        # SGLang's own call (RadixAttention -> forward): it binds as ``_arguments`` would bind it
        forward_batch = args[4]
    else:
        try:
            backend, q, layer, forward_batch = (
                _arguments(*args, **kwargs) if instance is None else _arguments(instance, *args, **kwargs)
            )
        except Exception:
            return _run_unnoted(wrapped, args, kwargs)
    return _noted_call(module, joined, plan, wrapped, args, kwargs, gated, backend, q, layer, forward_batch)


def _noted_call(module, joined, plan, wrapped, args, kwargs, gated, backend, q, layer, forward_batch):
    """A call some records repair at the kernel (``gated``): noted for the gate while SGLang's
    method runs (called with the query the ``before`` repairs gave it)."""
    hotfixes = joined.hotfixes
    if hotfixes is not plan.hotfixes:  # remove() ran since the plan was read: as with those records off
        gated = tuple(name for name in gated if name in hotfixes)
        if not gated:
            return _run_unnoted(wrapped, args, kwargs)
    call = Call(wrapped, backend, q, layer, forward_batch, gated, hotfixes)
    return _run_noted_here(module, wrapped, args, kwargs, call)


def _with_query(instance, args, kwargs, q):
    """The call's arguments with ``q`` as the method's query, where the call put it (the first
    argument after ``self``, or the keyword)."""
    at = 0 if instance is not None else 1  # wrapt passes an unbound call's self among the arguments
    if len(args) > at:
        return args[:at] + (q,) + args[at + 1 :], kwargs
    return args, dict(kwargs, q=q)


def _run_unnoted(wrapped, args, kwargs):
    """SGLang's method for a call no record repairs. Inside another call's note (foreign code between
    that method's start and its kernel call called this one: a KV-pool hook, an accuracy checker),
    the note is lifted for this call's duration: its kernel must get its own arguments, and the
    outer call's repair stays for the outer call's kernel."""
    if _current_call.get() is None:
        return wrapped(*args, **kwargs)
    token = _current_call.set(None)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _current_call.reset(token)


def _skipped(call, error, kind, records=None):
    for name in records or call.needed:
        logs.repair_skipped(_target(call.method), name, error, kind=kind)


def _run_noted_call(module, wrapped, args, kwargs, call):
    """SGLang's method with ``call`` noted for the gate until it returns (the gate put in the
    module first, if it is not there yet)."""
    gate = module.__dict__.get(GATED_GLOBAL)
    if type(gate) is not _gate_classes.get("flashinfer") or not gate._self_hotfix_on:  # _gate_on, inline
        if not _gate_in_place(module, call.hotfixes, call.needed):
            _skipped(call, LookupError(_no_gate_reason(module)), "no-gate")
            return wrapped(*args, **kwargs)
        gate = module.__dict__[GATED_GLOBAL]
    token = _current_call.set(call)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _current_call.reset(token)
    if not call.used and not call.delegated and gate._self_hotfix_on:
        # Every release these records accept calls a kernel in every call, from the method itself
        # (or a function it defines, or a delegate), through the module's ``flashinfer``: a call that
        # returned without its kernel call passing the gate reached the kernel some other way (the
        # global replaced after the gate went in, a proxy over it), unrepaired. (With the gate off,
        # remove() ran during the call: it ran as with the records off, as the operator asked.)
        _skipped(call, LookupError("the kernel call did not pass the gate"), "no-gate")
    return result


_run_noted = None  # _run_noted_call under torch.compiler.disable, made at the first compiled call
_dynamo_callback = None  # torch's getter of TorchDynamo's frame callback, found at the first noted call
_dynamo_tracing = None  # torch.compiler.is_compiling, found with it


def _run_noted_here(module, wrapped, args, kwargs, call):
    """``_run_noted_call``, run eagerly where TorchDynamo is compiling: it cannot trace a context
    variable's set and reset around a call (it baked the gate's branch in at trace time and the
    kernel got the release's arguments), so a call that needs a repair runs as in eager mode
    there. (The method wrapper itself is a graph break for every call: ``patch``'s
    ``_TRACERS_CALL_IT``; the frames it starts are TorchDynamo's to compile while its frame
    callback is set.) Where no callback is set (eager mode: every call of a server without
    ``--enable-torch-compile``, and CUDA-graph capture), the call runs directly: the disabling
    wrapper costs each call microseconds."""
    global _run_noted, _dynamo_callback, _dynamo_tracing
    if _dynamo_callback is None:
        _dynamo_callback, _dynamo_tracing = _find_dynamo_callback(), _find_dynamo_tracing()
    if not _dynamo_tracing():  # where TorchDynamo traces this frame, no untraceable call is made
        callback = _dynamo_callback()
        if callback is None or callback is False:  # None: eager; False: run-only (nothing new compiled)
            return _run_noted_call(module, wrapped, args, kwargs, call)
    if _run_noted is None:
        runner = _run_noted_call
        try:
            import torch

            runner = torch.compiler.disable(_run_noted_call)
        except Exception:  # a torch without torch.compiler: nothing compiles these calls there either
            pass
        _run_noted = runner
    return _run_noted(module, wrapped, args, kwargs, call)


def _find_dynamo_tracing():
    """``torch.compiler.is_compiling`` (True while TorchDynamo traces the frame that asks); where this
    torch has none, a stand-in that says no."""
    try:
        import torch

        return torch.compiler.is_compiling
    except Exception:
        return lambda: False


def _find_dynamo_callback():
    """``torch._C._dynamo.eval_frame.get_eval_frame_callback``; where this torch has none, a stand-in
    that says TorchDynamo may be compiling (every noted call then runs under the disabling wrapper,
    as before this check)."""
    try:
        import torch._C._dynamo.eval_frame as eval_frame

        return eval_frame.get_eval_frame_callback
    except Exception:
        return lambda: "unknown"


def _gate_on(module):
    """The module's ``flashinfer`` is our gate and ``remove()`` has not turned it off."""
    current = module.__dict__.get(GATED_GLOBAL)
    return type(current) is _gate_classes.get("flashinfer") and current._self_hotfix_on


def _gate_in_place(module, hotfixes, needed):
    """The gate is the module's ``flashinfer`` (put there now if it is not yet: the first call
    that needs a repair arms it, through the records that need it). False when it cannot be put there."""
    if _gate_on(module):
        return True
    from .. import patch

    return any(patch.arm_gates(hotfixes[name], module) for name in needed if name in hotfixes)


def _no_gate_reason(module):
    if GATED_GLOBAL not in module.__dict__:
        return "the module has no global %s (FlashInfer not imported)" % GATED_GLOBAL
    return "the hotfix's gate could not be put in %s.%s" % (MODULE, GATED_GLOBAL)


def _stand_in_for(stand_in, kernel):
    """What the kernel says of itself, said by what the gated module hands out in its place: its
    ``__module__``, ``__name__``, ``__qualname__`` and ``__doc__`` (a profiler's label, a
    HookRegistry hook's ``functools.wraps``), and ``__wrapped__`` (``inspect.signature`` and
    ``inspect.unwrap`` reach the kernel). What still differs, and why: docs/design.md, Limits."""
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            stand_in.__dict__[name] = getattr(kernel, name)
        except AttributeError:
            pass
    stand_in.__dict__["__wrapped__"] = kernel


# what wrapt calls (SGLang's function, kept alive by the wrapper anyway) -> the code objects below it:
# a plain dict, read at every repaired kernel call
_codes = {}
_FUNCTION = type(lambda: None)
_CODE = type((lambda: None).__code__)


def _with_nested(code):
    """``code`` and the code of every function defined in it, at any depth (``co_consts``): the
    code that runs when SGLang's method calls a function it defines, as 0.5.16's to 0.5.18's
    ``forward_extend`` calls the kernel from its nested ``_trtllm_context_attn``."""
    found, todo = [], [code]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(c for c in current.co_consts if type(c) is _CODE)
    return tuple(found)


def _one_of(code, codes):
    """``code`` is one of ``codes``, by identity: ``in`` would hash and compare code objects by
    content, recursively through their nested code (1.6 µs for 0.5.16's forward_extend, at every
    gated kernel call)."""
    for each in codes:
        if each is code:
            return True
    return False


def _method_codes(function):
    """The code objects of SGLang's method under ``function`` (the method wrapt calls, or a wrapper
    below the hotfix's that names it through ``__wrapped__``, as ``functools.wraps`` does) and of
    the functions nested in it (``_with_nested``); None where a wrapper below hides it (the gate
    then repairs the call's first kernel call, as it did before it could tell who is calling).
    Found once per function: every repaired kernel call asks."""
    function = getattr(function, "__func__", function)
    # Only a plain function is a key: a proxy (wrapt's partial for a call through the class holds
    # the instance) would keep the backend and its buffers alive here.
    cacheable = type(function) is _FUNCTION
    if cacheable and function in _codes:
        return _codes[function]
    found = function
    for _ in range(8):  # a chain of wrappers below, each naming the next
        below = getattr(found, "__wrapped__", None)
        if below is None:
            break
        found = getattr(below, "__func__", below)
    code = getattr(found, "__code__", None)
    codes = _with_nested(code) if type(code) is _CODE else None
    if cacheable:
        _codes[function] = codes
    return codes


class _GatedKernel:
    """A FlashInfer kernel as the gated module reaches it."""

    # No __slots__: TorchDynamo guards on the kernel's ``__dict__`` as SGLang's code reaches it.
    def __init__(self, kernel, gate, name, positional=0, argument_repair=None):
        self.kernel, self.gate, self.name = kernel, gate, name
        self.positional = positional  # the positional arguments SGLang's own call passes (register_noted_kernel)
        self.argument_repair = argument_repair  # register_argument_repair's, made first on every call
        _stand_in_for(self, kernel)

    def __call__(self, *args, **kwargs):
        if self.argument_repair is not None and self.gate._self_hotfix_on:
            kwargs = self.argument_repair(kwargs)
        call = _current_call.get()
        if call is None or not self.gate._self_hotfix_on:
            return self.kernel(*args, **kwargs)  # nothing to repair here, or remove() turned it off
        codes = _method_codes(call.function)
        if call.used:
            # A further kernel call in the same method call: repaired only when SGLang's method (or
            # a function it defines) makes it, by keywords: 0.5.16's context parallelism calls the
            # nested ``_trtllm_context_attn`` once per half of the batch. Anything else passes
            # through, and so does every further call where the caller cannot be told (a wrapper
            # below hides the method): there only the first kernel call is repaired.
            if len(args) > self.positional or codes is None or not _one_of(sys._getframe(1).f_code, codes):
                return self.kernel(*args, **kwargs)
        elif len(args) > self.positional:
            # SGLang's own calls pass keywords only (the records pin them): a positional call comes
            # from someone else's code between the gate and the kernel. Stand aside, and say so.
            call.used, call.kernel = True, self.name
            _skipped(call, TypeError("the kernel was called with %d positional argument(s)" % len(args)), "positional")
            return self.kernel(*args, **kwargs)
        elif codes is not None and not _one_of(sys._getframe(1).f_code, codes):
            # Not SGLang's method calling (nor a function it defines): other code running inside
            # the call (a hook or a checker calling FlashInfer itself, a proxy put over the module's
            # global) gets its own arguments; the method's own kernel calls get the repair, and a
            # method that returns without one is said (_run_noted_call). A delegate's call (0.5.19's
            # _run_fixed_q_len_decode) is the method's kernel call, with SGLang's arguments.
            if _DELEGATES and _one_of(sys._getframe(1).f_code, _delegate_codes(call.backend)):
                call.delegated = True
            return self.kernel(*args, **kwargs)
        call.used, call.kernel = True, self.name
        for name in call.needed:  # each its own argument: the order changes nothing the kernel gets
            try:
                kwargs = _REPAIRS[name](call, kwargs)
            except Exception as error:
                # This repair could not be computed before the kernel ran: this call is as with the
                # record off; the other records' repairs still apply.
                _skipped(call, error, "not-computed", (name,))
        return self.kernel(*args, **kwargs)  # what it raises propagates, as upstream's call would

    def __getattr__(self, name):
        return getattr(self.kernel, name)


class _ArgumentRepairedKernel:
    """A FlashInfer kernel whose calls through the gate get a record's ``register_argument_repair``
    (no noted call: the repair is decided by the arguments)."""

    def __init__(self, kernel, repair, gate):
        self.kernel, self.repair, self.gate = kernel, repair, gate
        _stand_in_for(self, kernel)

    def __call__(self, *args, **kwargs):
        if self.gate._self_hotfix_on:
            kwargs = self.repair(kwargs)
        return self.kernel(*args, **kwargs)  # what it raises propagates, as upstream's call would

    def __getattr__(self, name):
        return getattr(self.kernel, name)


_gate_classes = {}  # made once, at the first gate (they subclass patch's GateProxy, which needs wrapt)


def _gate_class():
    if _gate_classes:
        return _gate_classes["flashinfer"]
    from .. import patch  # imported only when a gate is armed, as patch itself

    class FlashInferSubmoduleGate(patch.GateProxy):
        """``flashinfer.decode`` / ``flashinfer.prefill`` as the gated module reaches them: the
        submodule (attribute writes and deletions go to it, so ``mock.patch`` through the
        backend's name patches FlashInfer itself, as without the hotfix), its kernel looked up at
        each access as SGLang's own code looks it up (a kernel replaced later, by a profiler, a
        mock or a HookRegistry hook, is the one called, with upstream's arguments), and gated."""

        def __init__(self, submodule, submodule_name, gate):
            super().__init__(submodule)
            self._self_submodule_name, self._self_gate = submodule_name, gate
            self._self_kernel_name = KERNELS[submodule_name]
            self._self_kept = {}  # kernel name -> (kernel, what the gated module hands out for it)

        def __getattr__(self, name):
            found = getattr(self.__wrapped__, name)
            key = (self._self_submodule_name, name)
            noted = name == self._self_kernel_name or key in _ALSO_NOTED
            repair = None if name == self._self_kernel_name else _ARGUMENT_REPAIRS.get(key)
            if repair is None and not noted:
                return found
            pair = self._self_kept.get(name)  # one read: another thread may swap it meanwhile
            if pair is None or pair[0] is not found:  # a kernel replaced since (a profiler, a mock): that one
                made = (
                    # repaired by the noted call (and first by its own arguments, where a record says so)
                    _GatedKernel(found, self._self_gate, name, _ALSO_NOTED.get(key, 0), repair)
                    if noted
                    else _ArgumentRepairedKernel(found, repair, self._self_gate)  # by its own arguments
                )
                pair = self._self_kept[name] = (found, made)
            return pair[1]

    class FlashInferGate(patch.GateProxy):
        """The module's global ``flashinfer`` once a record of the site armed it: FlashInfer itself, looked up
        at each access, but for the kernels' submodules (a gate kept per submodule object)."""

        def __init__(self, gated):
            super().__init__(gated)
            self._self_submodule_gates = {}

        def __getattr__(self, name):
            submodule = getattr(self.__wrapped__, name)
            if name not in KERNELS:
                return submodule
            kept = self._self_submodule_gates.get(name)
            if kept is None or kept.__wrapped__ is not submodule:
                kept = self._self_submodule_gates[name] = FlashInferSubmoduleGate(submodule, name, self)
            return kept

    # The names every repaired call reads (``flashinfer.decode.trtllm_batch_decode_with_kv_cache``)
    # as properties: found on the class, they cost no failed lookup (a wrapt proxy's miss raises and
    # clears an AttributeError before ``__getattr__`` runs), twice per kernel call.
    for name in KERNELS:
        setattr(FlashInferGate, name, _forwarded(FlashInferGate, name))
    for name in set(KERNELS.values()) | {kernel for _, kernel in list(_ARGUMENT_REPAIRS) + list(_ALSO_NOTED)}:
        setattr(FlashInferSubmoduleGate, name, _forwarded(FlashInferSubmoduleGate, name))
    _gate_classes.update(flashinfer=FlashInferGate, submodule=FlashInferSubmoduleGate)
    return FlashInferGate


def _forwarded(cls, name):
    """A property answering ``name`` as the class's ``__getattr__`` does (that function itself, its
    name bound by ``functools.partial``: no frame of its own), its writes and deletions going to
    the gated object (as a wrapt proxy sends them: ``mock.patch`` through the gate)."""
    get = functools.partial(cls.__getattr__, name=name)

    def set_(self, value):
        setattr(self.__wrapped__, name, value)

    def delete(self):
        delattr(self.__wrapped__, name)

    return property(get, set_, delete)


def make_gate(module, flashinfer):
    return _gate_class()(flashinfer)
