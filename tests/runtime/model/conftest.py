"""Shared models for the model-layer tests: each is loaded once per session."""

from __future__ import annotations

import warnings

import pytest
import torch

from dualpath.runtime.model import LoadedModel, load_model


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread for these tests. On a small shared machine (2 cores, other jobs), every
    OpenMP parallel region waits for a descheduled sibling thread: decode steps ran 15x slower with
    2 threads than with 1. Restored after each module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny", seed=0)


@pytest.fixture(scope="session")
def hf_smollm2():
    """transformers' own GGUF loading of the same file: (LlamaForCausalLM, tokenizer), float32."""
    transformers = pytest.importorskip("transformers")
    from dualpath.runtime.model.loader import smollm2_gguf_path

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    path = smollm2_gguf_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer
