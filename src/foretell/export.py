"""`foretell export`: drafters in the formats other engines load.

  eagle3       an EAGLE-3 head (foretell's folder, or an engine checkpoint) in the layout vLLM and SGLang load
               (models/eagle3_format.py; docs/eagle3.md cites the loaders)
  draft-model  a draft model (a distilled AdaSPEC draft, any HF folder, preset or .gguf foretell reads) as a plain
               Hugging Face folder: transformers loads it, e.g. as `assistant_model` of `generate`
  dflash       refused, with the reason: the parallel head does not map onto DFlash's architecture
"""

from __future__ import annotations

from pathlib import Path

from foretell.errors import ForetellError
from foretell.files import readable_as_umask_allows
from foretell.models.derive import save_model_folder
from foretell.models.eagle3_format import export_eagle3, load_eagle3_head
from foretell.runtime.loading import load_model, parse_dtype

DFLASH_REASON = (
    "the parallel head does not map onto DFlash's layout exactly, so it cannot be exported as one: DFlash projects "
    "the fused target states (fc + hidden_norm) straight into every draft layer's keys and values, while the "
    "parallel head runs its context rows (fused states plus the next token's embedding) through its layers; "
    "DFlash's block starts from the last token's embedding and fills the rest with the embedding of a mask token, "
    "the head from its last context row and a learned vector that is no token's embedding; DFlash attends "
    "bidirectionally within the block, the head causally (docs/eagle3.md#dflash)"
)


def add_export_parser(sub) -> None:
    e = sub.add_parser("export", help="write a drafter in the format vLLM / SGLang (eagle3) or transformers (draft-model) load",
                       description="Write a drafter in another engine's format.")
    kinds = e.add_subparsers(dest="export_command", required=True, metavar="KIND")
    p = kinds.add_parser("eagle3", help="an EAGLE-3 head as the checkpoint vLLM and SGLang load",
                         description="config.json + model.safetensors in the EAGLE-3 layout both engines load "
                         "(architectures LlamaForCausalLMEagle3; the aux layer ids in each engine's convention).")
    p.add_argument("--head", required=True, help="the head: foretell's folder (foretell train eagle3: OUT/head) or an EAGLE-3 checkpoint")
    p.add_argument("--target", required=True, help="its target: preset, .gguf or HF folder")
    add_output_arguments(p, "bfloat16")
    p.set_defaults(run=cmd_export_eagle3)
    d = kinds.add_parser("draft-model", help="a draft model as a plain Hugging Face folder (transformers' assistant_model)",
                         description="config.json, model.safetensors and the tokenizer files: transformers' "
                         "AutoModelForCausalLM loads it, and generate(..., assistant_model=...) uses it as the draft.")
    d.add_argument("--draft", required=True, help="the draft: a folder (foretell train adaspec: OUT/draft/model), preset or .gguf")
    add_output_arguments(d, "float32")
    d.set_defaults(run=cmd_export_draft_model)
    f = kinds.add_parser("dflash", help="not possible for foretell's parallel head; says why",
                         description="Explains why the parallel head has no DFlash export.")
    f.add_argument("--head", help="a parallel head folder (ignored)")
    f.set_defaults(run=cmd_export_dflash)


def add_output_arguments(p, dtype: str) -> None:
    """--out and --dtype of the exports that write weights (`dtype`: the kind's default)."""
    p.add_argument("--out", required=True, help="folder to write")
    p.add_argument("--dtype", default=dtype, choices=("bfloat16", "float16", "float32"),
                   help="weights dtype (default: %(default)s)")


def cmd_export_dflash(args) -> None:
    raise ForetellError(DFLASH_REASON)


def cmd_export_eagle3(args) -> None:
    target = load_model(args.target, "float32")
    head = load_eagle3_head(Path(args.head), target.model)
    out = readable_as_umask_allows(export_eagle3(head, args.out, parse_dtype(args.dtype)))
    layers = list(head.config.aux_layers)
    print(f"EAGLE-3 head for {args.target} -> {out} (aux layers {layers}: vLLM ids {layers}, SGLang ids "
          f"{[x - 1 for x in layers]})")
    print(f"vLLM:   vllm serve TARGET --speculative-config '{{\"method\": \"eagle3\", \"model\": \"{out}\", "
          "\"num_speculative_tokens\": 5}'")
    print(f"SGLang: python -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 "
          f"--speculative-draft-model-path {out} --speculative-num-steps 5 --speculative-eagle-topk 4 "
          "--speculative-num-draft-tokens 24")


def export_draft_model(spec: str, out: str | Path, dtype: str = "float32") -> Path:
    """A draft model foretell loads (folder, preset, .gguf) as a Hugging Face folder with its tokenizer."""
    draft = load_model(spec, dtype)
    return readable_as_umask_allows(save_model_folder(draft.model, draft.tokenizer, out,
                                                      extra={"exported_from": str(spec)}))


def cmd_export_draft_model(args) -> None:
    out = export_draft_model(args.draft, args.out, args.dtype)
    print(f"draft model {args.draft} -> {out} (transformers: AutoModelForCausalLM.from_pretrained('{out}'), then "
          "model.generate(..., assistant_model=draft))")
