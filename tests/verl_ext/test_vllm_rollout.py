"""fp8rl.verl_ext.vllm_rollout (GPU only) against verl 0.9.1's source: every verl name it
overrides, patches or calls exists there, with the shape this module relies on. verl is
read, not imported (its import takes 14 s and its vLLM modules need a GPU stack)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import tomllib
from pathlib import Path

import pytest

from fp8rl.verl_ext import rollout_quant, vllm_plugin

from room_rules import REPO

VERL = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
OURS = ast.parse((REPO / "fp8rl/verl_ext/vllm_rollout.py").read_text())
#: our module's alias -> verl's file
ALIASES = {
    "verl_quant_utils": "utils/vllm/vllm_quant_utils.py",
    "verl_fp8_utils": "utils/vllm/vllm_fp8_utils.py",
    "verl_vllm_utils": "workers/rollout/vllm_rollout/utils.py",
}


def _tree(rel: str) -> ast.Module:
    return ast.parse((VERL / rel).read_text())


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    return cls


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_every_verl_attribute_we_touch_exists_in_verl() -> None:
    used: dict[str, set[str]] = {alias: set() for alias in ALIASES}
    for node in ast.walk(OURS):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in used:
                used[node.value.id].add(node.attr)
    assert used["verl_quant_utils"] >= {"quant_weights", "is_fp8_weight", "is_quantized_model"}
    for alias, names in used.items():
        missing = names - _top_level_names(_tree(ALIASES[alias]))
        assert not missing, f"verl's {ALIASES[alias]} has no {sorted(missing)}"


def test_the_methods_we_override_are_verls() -> None:
    server = _tree("workers/rollout/vllm_rollout/vllm_async_server.py")
    worker = _tree("workers/rollout/vllm_rollout/utils.py")
    pairs = [
        ("Fp8rlVllmHttpServer", server, "vLLMHttpServer"),
        ("Fp8rlVllmReplica", server, "vLLMReplica"),
        ("Fp8rlWorkerExtension", worker, "vLLMColocateWorkerExtension"),
    ]
    for ours, tree, base in pairs:
        mine, theirs = _methods(_class(OURS, ours)), _methods(_class(tree, base))
        assert set(mine) <= set(theirs), (ours, set(mine) - set(theirs))
        for name, fn in mine.items():  # same positional parameters, or passed on whole
            if fn.args.vararg is not None:
                continue
            assert [a.arg for a in fn.args.args] == [a.arg for a in theirs[name].args.args]
    source = (VERL / "workers/rollout/vllm_rollout/vllm_async_server.py").read_text()
    assert "quantization, hf_overrides = self._apply_quantization()" in source
    assert '"worker_extension_cls": self._get_worker_extension_cls()' in source
    assert "self.server_class = ray.remote(vLLMHttpServer)" in source


def test_the_weight_sync_reads_the_names_we_patch_at_call_time() -> None:
    quant = _tree("utils/vllm/vllm_quant_utils.py")
    load = [n for n in quant.body if isinstance(n, ast.FunctionDef)]
    (fn,) = [n for n in load if n.name == "load_quanted_weights"]
    calls = {
        c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
    }
    assert "quant_weights" in calls  # a global lookup: the patched module attribute is used
    (fp8,) = [n for n in load if n.name == "is_fp8_weight"]
    assert [a.arg for a in fp8.args.args] == ["name", "model"]
    text = (VERL / "utils/vllm/vllm_quant_utils.py").read_text()
    assert "seen_params" in text and "fp8_param_names" in text
    worker = (VERL / "workers/rollout/vllm_rollout/utils.py").read_text()
    assert worker.count("is_quantized_model(") >= 4  # start-up, stage, finalise, load
    refit = (VERL / "utils/vllm/vllm_fp8_utils.py").read_text()
    assert '"weight_scale"' in refit  # the channel layout's scale name is staged for refits


def test_verls_replica_registry_takes_a_loader_by_name() -> None:
    registry = _class(_tree("workers/rollout/replica.py"), "RolloutReplicaRegistry")
    register = _methods(registry)["register"]
    assert [a.arg for a in register.args.args] == ["cls", "name", "loader"]


def test_without_vllm_the_module_says_what_it_needs() -> None:
    if importlib.util.find_spec("vllm") is not None:  # a GPU node's stack: it imports
        module = importlib.import_module("fp8rl.verl_ext.vllm_rollout")
        assert issubclass(module.Fp8rlVllmReplica, module.vLLMReplica)
        return
    with pytest.raises(ImportError, match="needs vLLM, which is GPU-only"):
        importlib.import_module("fp8rl.verl_ext.vllm_rollout")


def test_the_plugin_is_registered_and_reads_the_same_variable() -> None:
    assert vllm_plugin.ENV_VAR == rollout_quant.ENV_VAR
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    plugins = meta["project"]["entry-points"]["verl.plugins"]
    assert plugins["fp8rl_vllm_rollout"] == "fp8rl.verl_ext.vllm_plugin"
