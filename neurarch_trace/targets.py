"""Turn a target string into a model: ``file.py:Attr``, ``package.module:attr`` or ``hf:<id or folder>``.

``Attr`` may be dotted (``models.ResNet18``) and may name an ``nn.Module`` instance, an
``nn.Module`` subclass (instantiated with no arguments) or a callable returning one (called with no
arguments).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import sys
from typing import Any, Iterator

import torch
from torch import nn

from neurarch_trace.errors import TargetError, is_out_of_memory
from neurarch_trace.text import error_line, install_hint

__all__ = ["LoadedTarget", "OpenedTarget", "load_target", "open_target", "resolve_attribute", "HF_DEFAULT_INPUT"]

HF_DEFAULT_INPUT = "1,16"


@dataclasses.dataclass
class LoadedTarget:
    """A built model and what the command line needs to know about where it came from."""

    model: nn.Module
    name: str
    kind: str  # "file", "module" or "hf"


def load_target(target: str, *, device: str = "cpu", weights: bool = False, hf_class: str = "AutoModel",
                quiet: bool = True) -> LoadedTarget:
    """Build the model a target names: :func:`open_target` then :meth:`OpenedTarget.build`.

    Args:
        target: ``path/to/file.py:Attr``, ``pkg.module:attr`` or ``hf:<repo id or local folder>``.
        device: where to build it (``cpu`` or ``meta``; for ``hf:`` targets the model is built from
            its config on this device).
        weights: ``hf:`` only: load the checkpoint's real weights (downloads them for a hub id)
            instead of building from ``config.json`` alone. Parameter counts are the same.
        hf_class: ``hf:`` only: the transformers class that builds the model, ``AutoModel`` (the
            bare model, no task head) by default; ``AutoModelForCausalLM`` adds the LM head.
        quiet: ``hf:`` only: silence transformers' own warnings and progress bars.

    Raises:
        TargetError: an unknown target form, a missing file or attribute, an import that fails, a
            factory that raises or returns something else than an ``nn.Module``, ``hf:`` without
            transformers, or an ``hf:`` id that cannot be found.
    """
    return open_target(target, weights=weights, hf_class=hf_class, quiet=quiet).build(device)


@dataclasses.dataclass
class OpenedTarget:
    """A target whose module is imported (or whose ``hf:`` config is read), ready to build the model
    once or more, on one device or another (the meta device first, the CPU if the forward needs real
    values), without importing it again."""

    target: str
    kind: str  # "file", "module" or "hf"
    name: str
    _build: Any
    #: The target names an ``nn.Module`` instance the module built at import: it is traced where its
    #: tensors are, whatever the device asked for.
    instance: bool = False
    #: Lines worth telling the user about a build (an ``hf:`` config changed to run on meta).
    notes: list = dataclasses.field(default_factory=list)

    def build(self, device: str = "cpu") -> LoadedTarget:
        """The model, built on ``device`` (``cpu`` or ``meta``). An ``nn.Module`` instance the module
        holds is returned as it is, wherever its tensors are.

        Raises:
            TargetError: the class, factory or transformers raised, or built no ``nn.Module``.
        """
        try:
            return LoadedTarget(model=self._build(device), name=self.name, kind=self.kind)
        except TargetError as exc:
            cause = exc.__cause__
            if device == "meta" and cause is not None and "meta" in str(cause).lower():
                raise TargetError(f"{exc} (the meta device holds no values): build it on the CPU instead "
                                  "(--device cpu)") from cause
            raise


def open_target(target: str, *, weights: bool = False, hf_class: str = "AutoModel",
                quiet: bool = True) -> OpenedTarget:
    """Import what a target names (its file or module, or an ``hf:`` config) without building the
    model. Arguments and errors as :func:`load_target`'s."""
    check_target_form(target)
    if target.startswith("hf:"):
        return _open_hf(target, weights=weights, hf_class=hf_class, quiet=quiet)
    where, attr = target.rsplit(":", 1)
    if where.endswith(".py") or os.sep in where or "/" in where:
        module = _import_file(where)
        kind = "file"
    else:
        module = _import_module(where)
        kind = "module"

    def build(device: str) -> nn.Module:
        with _device(device):
            return resolve_attribute(module, attr, where=where)

    return OpenedTarget(target=target, kind=kind, name=attr.rsplit(".", 1)[-1], _build=build,
                        instance=isinstance(_attribute(module, attr), nn.Module))


def _attribute(module: Any, attr: str) -> Any:
    """What the dotted ``attr`` names in ``module``, or None when a part is missing (the build says so)."""
    obj, _, missing = _follow(module, attr)
    return None if missing is not None else obj


def _follow(module: Any, attr: str) -> tuple:
    """``(object, parts walked, missing part or None)`` along the dotted ``attr`` from ``module``."""
    obj = module
    walked: list[str] = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            return obj, walked, part
        obj = getattr(obj, part)
        walked.append(part)
    return obj, walked, None


def check_target_form(target: str) -> None:
    """Raise :class:`TargetError` unless ``target`` has one of the three forms (nothing is imported)."""
    if target.startswith("hf:"):
        if not target[3:]:
            raise TargetError("hf: needs a repo id or a local folder, e.g. hf:bert-base-uncased or hf:./my-checkpoint")
        return
    if ":" not in target:
        raise TargetError(
            f"target {target!r} names no attribute: write path/to/file.py:Model, package.module:Model or hf:<repo-id>"
        )
    where, attr = target.rsplit(":", 1)
    if not where or not attr:
        raise TargetError(
            f"target {target!r} is incomplete: write path/to/file.py:Model, package.module:Model or hf:<repo-id>"
        )


@contextlib.contextmanager
def _device(device: str) -> Iterator[None]:
    if device == "cpu":
        yield
        return
    with torch.device(device):
        yield


def _import_file(path: str) -> Any:
    if not os.path.exists(path):
        where = "" if os.path.isabs(path) else f" (it is relative to {os.getcwd()})"
        raise TargetError(f"file {path} does not exist: check the path{where}")
    if os.path.isdir(path):
        raise TargetError(f"{path} is a folder: name a .py file, e.g. {path.rstrip('/')}/model.py:Model")
    abspath = os.path.abspath(path)
    folder = os.path.dirname(abspath)
    stem = os.path.splitext(os.path.basename(abspath))[0]
    mod_name = f"neurarch_target_{abs(hash(abspath)):x}_{stem}" if stem in sys.modules else stem
    spec = importlib.util.spec_from_file_location(mod_name, abspath)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # sibling imports, as `python file.py` would allow
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(mod_name, None)
        raise TargetError(f"importing {path} failed: SyntaxError at line {exc.lineno}: {exc.msg}") from exc
    except BaseException as exc:  # noqa: BLE001 - the user's module-level code can raise anything
        sys.modules.pop(mod_name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        hint = ""
        if isinstance(exc, ImportError) and "relative import" in str(exc):  # `from .layers import X`
            hint = "; a file target is imported alone, without its package: " + _as_module(folder, stem)
        raise TargetError(f"importing {path} failed: {error_line(exc)}{hint}") from exc
    return module


def _as_module(folder: str, stem: str) -> str:
    """How to name the file ``stem``.py in ``folder`` as a module target: its dotted name through
    the folders above it that hold an ``__init__.py``, and the folder to run from."""
    parts = [stem]
    while os.path.isfile(os.path.join(folder, "__init__.py")) and os.path.dirname(folder) != folder:
        parts.insert(0, os.path.basename(folder))
        folder = os.path.dirname(folder)
    if len(parts) == 1:
        return "put it in a package (a folder with an __init__.py) and name it as package.module:Attr"
    where = os.path.relpath(folder)
    return f"name it as a module, {'.'.join(parts)}:Attr, from {'this folder' if where == '.' else where}"


def _import_module(name: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # the working directory first, as `python -m` does
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise TargetError(
                f"cannot import module {name!r}: no module named {exc.name!r} "
                "(run from the folder that holds it, or give a file path)"
            ) from exc
        raise TargetError(f"importing {name} failed: {error_line(exc)}") from exc
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise TargetError(f"importing {name} failed: {error_line(exc)}") from exc


def resolve_attribute(module: Any, attr: str, *, where: str) -> nn.Module:
    """Follow a dotted ``attr`` from ``module`` and turn what it names into an ``nn.Module``.

    Raises:
        TargetError: a missing attribute (the message lists what the module offers), or a class or
            factory that raises or returns something that is not an ``nn.Module``.
    """
    obj, walked, missing = _follow(module, attr)
    if missing is not None:
        offers = _offers(obj)
        hint = f"; it offers {', '.join(offers)}" if offers else ""
        owner = where if not walked else f"{where}:{'.'.join(walked)}"
        raise TargetError(f"{owner} has no attribute {missing!r}{hint}")
    return as_module(obj, label=f"{where}:{attr}")


#: What Python says of a call with the wrong arguments (``missing 1 required positional argument``,
#: ``takes 2 positional arguments but 3 were given``, ``got an unexpected keyword argument``).
_ARGUMENTS = re.compile(r"missing \d+ required|takes \d+ positional|takes no arguments|unexpected keyword argument|"
                        r"positional argument")


def as_module(obj: Any, *, label: str) -> nn.Module:
    """An ``nn.Module`` instance as is; a subclass instantiated; a factory called (no arguments).

    Raises:
        TargetError: the class or factory raised, or returned something else.
    """
    if isinstance(obj, nn.Module):
        return obj
    if inspect.isclass(obj) and not issubclass(obj, nn.Module):
        raise TargetError(f"{label} is the class {obj.__name__}, which is not a torch.nn.Module subclass")
    if not callable(obj):
        raise TargetError(f"{label} is a {type(obj).__name__}, not an nn.Module, a Module class or a factory")
    what = f"{obj.__name__}()" if hasattr(obj, "__name__") else f"{label}()"
    try:
        built = obj()
    except TypeError as exc:
        if not _ARGUMENTS.search(str(exc)):  # a TypeError from inside the build: its own words
            raise TargetError(f"calling {what} failed: {error_line(exc)}") from exc
        raise TargetError(
            f"calling {what} failed: {error_line(exc)} "
            "(the target is called with no arguments; point at a factory that takes none)"
        ) from exc
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        if is_out_of_memory(exc):
            raise TargetError(f"building {what} ran out of memory ({error_line(exc)}): its weights do not fit in this "
                              "machine's memory; build it on the meta device, which allocates nothing (--device meta)"
                              ) from exc
        raise TargetError(f"calling {what} failed: {error_line(exc)}") from exc
    if not isinstance(built, nn.Module):
        name = type(built).__name__
        article = "an" if name[:1].lower() in "aeiou" else "a"
        raise TargetError(f"{what} returned {article} {name}, not a torch.nn.Module")
    return built


def _offers(owner: Any) -> list[str]:
    """What a module (or a class holding models) defines that could be a target."""
    home = getattr(owner, "__name__", None) if inspect.ismodule(owner) else getattr(owner, "__module__", None)
    names = []
    try:
        items = sorted(vars(owner).items())
    except TypeError:
        return names
    for name, value in items:
        if name.startswith("_"):
            continue
        if isinstance(value, nn.Module):
            names.append(name)
        elif inspect.isclass(value) and getattr(value, "__module__", None) == home:
            names.append(name)
        elif inspect.isfunction(value) and value.__module__ == home:
            names.append(name)
    if len(names) > _SHOWN:  # a long list is cut, and says so
        return names[:_SHOWN] + [f"and {len(names) - _SHOWN} more"]
    return names


#: How many of a module's models an error lists.
_SHOWN = 12


def _whole_message(exc: BaseException) -> str:
    """``TypeName: every line of the message``, on one line: a config validation error says what
    is wrong only on its second line (``Field 'hidden_size' expected int, got str``)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _looks_like_path(ident: str) -> bool:
    # a hub id is "name" or "org/name"; anything else that names the file system is a path
    return ident.startswith((".", "/", "~")) or ident.count("/") > 1 or os.sep != "/" and os.sep in ident


#: Seconds the hub's address may take to answer one connection before it counts as unreachable.
HUB_TIMEOUT_S = 3.0


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` set (as huggingface_hub reads it: any value but empty, 0, false, no, off)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off")


def hub_unreachable(timeout: float = HUB_TIMEOUT_S) -> str | None:
    """None when one TCP connection to the hub (``HF_ENDPOINT``, default https://huggingface.co)
    opens within ``timeout`` seconds, else why not (``no network``, ``timed out after 3 s``). The
    name lookup, which a socket timeout does not bound, runs on a daemon thread, so this returns
    within ``timeout`` whatever the network does; huggingface_hub's own retries would take 30 s."""
    import socket
    import threading
    from urllib.parse import urlsplit

    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    result: list = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as exc:
            result.append(f"{host}:{port}: {exc.strerror or exc}")

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    if not result:
        return f"{host}:{port}: no answer within {timeout:g} s"
    return result[0]


def _check_repo_id(ident: str) -> None:
    """Raise :class:`TargetError` when ``ident`` cannot be a hub repo id (``huggingface_hub``'s own
    rule: ``name`` or ``namespace/name`` of letters, digits, ``-``, ``_`` and ``.``), where the
    lookup would call it missing from the cache; a revision (``@main``) is not part of an id."""
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # an older hub library: the lookup's own answer stands
        return
    try:
        validate_repo_id(ident)
    except HFValidationError as exc:
        raise TargetError(f"hf:{ident} is not a Hugging Face repo id (name or namespace/name, of letters, digits, "
                          "'-', '_' and '.'): give one, such as hf:bert-base-uncased or hf:meta-llama/Llama-2-7b-hf, "
                          "or a local folder (hf:./path)") from exc


def _open_hf(target: str, *, weights: bool, hf_class: str = "AutoModel", quiet: bool = True) -> OpenedTarget:
    ident = target[3:]
    if not ident:
        raise TargetError("hf: needs a repo id or a local folder, e.g. hf:bert-base-uncased or hf:./my-checkpoint")
    try:
        import transformers
    except ImportError as exc:
        raise TargetError(
            f"hf: targets need the transformers package: {install_hint('transformers', 'hf')}"
        ) from exc
    if quiet:
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    builder = getattr(transformers, hf_class, None)
    # Auto classes build with from_config; a model class (LlamaForCausalLM) with _from_config
    from_config = getattr(builder, "from_config", None) or getattr(builder, "_from_config", None)
    if from_config is None:
        raise TargetError(
            f"--hf-class {hf_class!r} is not a transformers model class: use AutoModel, AutoModelForCausalLM, "
            "AutoModelForSequenceClassification, ... or a class such as LlamaForCausalLM"
        )
    ident = os.path.expanduser(ident)
    local = os.path.isdir(ident)
    if os.path.exists(ident) and not local:
        raise TargetError(f"hf:{ident} is a file: give the checkpoint folder that holds config.json")
    if not local and _looks_like_path(ident):
        raise TargetError(f"hf:{ident}: folder {ident} does not exist")
    if not local:
        _check_repo_id(ident)
    if local and not os.path.exists(os.path.join(ident, "config.json")):
        raise TargetError(f"hf:{ident} has no config.json: give a folder written by save_pretrained, or a hub repo id")
    offline = _hub_offline()
    unreachable = None if local or offline else hub_unreachable()
    cache_only = offline or unreachable is not None
    try:
        config = transformers.AutoConfig.from_pretrained(ident, local_files_only=cache_only)
    except OSError as exc:
        if local:
            config = os.path.join(ident, "config.json")
            raise TargetError(f"hf:{ident}: cannot read {config}: {error_line(exc)}") from exc
        if unreachable is not None:
            raise TargetError(
                f"cannot reach the Hugging Face hub ({unreachable}) and {ident!r} is not in the local cache: "
                "connect and try again, or pass a local folder (hf:./path)"
            ) from exc
        why = ("HF_HUB_OFFLINE is set and it is not in the local cache" if offline
               else "it is neither a local folder nor a repo the hub or the local cache has")
        raise TargetError(
            f"cannot find Hugging Face model {ident!r}: {why}; download it first or pass a local folder (hf:./path)"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a config's own validation can raise anything (a str where an int goes)
        raise TargetError(
            f"hf:{ident}: transformers cannot read its config.json ({_whole_message(exc)}): fix the file or "
            "pass a folder written by save_pretrained"
        ) from exc

    _check_config_dtype(ident, config)

    def build(device: str) -> nn.Module:
        try:
            if weights:
                model = builder.from_pretrained(ident, config=config, local_files_only=cache_only)
                return model.to(device) if device != "cpu" else model
            with _device(device):
                return from_config(_runs_on_meta(config, opened) if device == "meta" else config)
        except OSError as exc:
            why = error_line(exc).rstrip(".")
            raise TargetError(f"cannot load the weights of Hugging Face model {ident!r}: {why}; leave out --weights to "
                              "trace it from its config.json alone (shapes, parameters and FLOPs do not depend on "
                              "the weights)") from exc
        except Exception as exc:  # noqa: BLE001 - a model's own __init__ can raise anything (on meta too)
            raise TargetError(f"transformers cannot build hf:{ident}: {error_line(exc)}") from exc

    name = os.path.basename(os.path.normpath(ident)) if local else ident.rstrip("/").split("/")[-1]
    opened = OpenedTarget(target=target, kind="hf", name=name, _build=build)
    return opened


#: The dtypes transformers builds a model's weights in (a config's ``dtype``/``torch_dtype``).
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_config_dtype(ident: str, config: Any) -> None:
    """Raise :class:`TargetError` (one sentence) when ``config.json`` names a weight dtype that
    transformers cannot build a model in (``int8``, ``float8_e4m3fn``, a number): transformers'
    own error for it is a storage or attribute error from deep in its ``__init__``. Quantised
    checkpoints name their format in ``quantization_config`` and keep a floating ``dtype``."""
    dtype = getattr(config, "dtype", None)
    if dtype is None or dtype == "auto" or dtype in WEIGHT_DTYPES:
        return
    shown = str(dtype).replace("torch.", "")
    raise TargetError(f"hf:{ident}: config.json's dtype {shown!r} is not a dtype transformers builds weights in: set "
                      "it to float32, float16 or bfloat16, or leave it out")


#: What a meta build of a config with ``use_cache: false`` says (:func:`_runs_on_meta`).
USE_CACHE_NOTE = ("config.json says use_cache: false; traced with use_cache true, as the meta device cannot "
                  "answer transformers' packed-sequence check on the position ids (layers, shapes, parameters "
                  "and FLOPs are the same; the plan leaves out the KV cache the forward then returns)")


def _runs_on_meta(config: Any, opened: OpenedTarget) -> Any:
    """``config``, or a copy with ``use_cache = True`` when it says ``False``: without a KV cache and
    without an attention mask, transformers' decoders (5.x ``masking_utils``) look at the position
    ids' values for packed sequences (``find_packed_sequence_indices``), which meta tensors do not
    have, so the forward would stop after the embedding. Many fine-tuned checkpoints save
    ``use_cache: false``. The change adds a note to ``opened.notes``."""
    if getattr(config, "use_cache", None) is not False:
        return config
    config = copy.deepcopy(config)
    config.use_cache = True
    if USE_CACHE_NOTE not in opened.notes:
        opened.notes.append(USE_CACHE_NOTE)
    return config
