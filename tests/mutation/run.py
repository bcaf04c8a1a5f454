"""Mutation testing of the functions mutmut 3 cannot mutate (it skips every decorated function, and
the sampling loop, the physical pruning and the magnitude scores are all ``@torch.no_grad()``).

Each mutant is one AST edit of one target function (arithmetic/comparison/boolean operator swap,
constant change, unary-operator removal, statement deletion). The parent imports torch and the code
once; every mutant runs in a fork that swaps the function's ``__code__`` for the mutated one and runs
the target's tests with pytest (``-x -q -p no:cacheprovider``): a failing run kills the mutant, a
passing run means it survived, a run past the time limit is a timeout. An edit that does not compile
(a deleted assignment that a ``nonlocal`` needs) is not a program: it is printed as skipped and not scored.
Constants inside a keyword argument that only styles a drawing (``STYLE_KWARGS``: line widths, marker and
font sizes, alpha, z-order, paddings, legend placement) are not mutated: no test can tell 1.2 from 2.2
there short of restating the value. One worker.

    .venv/bin/python tests/mutation/run.py [--only SUBSTRING[,SUBSTRING...]] [--list]   # NAME$: that function only
    .venv/bin/python tests/mutation/run.py --GROUP [--only SUBSTRING]   # one group of GROUPS (make mutation-GROUP)
    .venv/bin/python tests/mutation/run.py --summary   # per-file score of mutmut's run + this one

The groups and what each covers: ``--help``. Results go to mutants/decorated-results.json, with a group to the
results file GROUPS names for it (mutants/ is mutmut's work folder, git-ignored); a run with --only replaces its
functions' results and keeps the rest; ``--survivors`` reruns only the mutants not killed last time (after new
tests), keeping the records of the killed ones. The file is written after each function (a stopped run keeps
what it measured), under a lock: two drivers may run disjoint --only sets of one group at once.
"""
from __future__ import annotations

import argparse
import ast
import copy
import importlib
import inspect
import json
import os
import signal
import sys
import textwrap
import time
from functools import partial

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (module, qualified name, tests that exercise it)
SAMPLING_TESTS = ["tests/test_sampling.py", "tests/test_sampling_semantics.py", "tests/test_sampling_gaps.py",
                  "tests/test_fast_sampler.py"]
PRUNE_TESTS = ["tests/test_methods.py", "tests/test_checkpoint.py",
               "tests/test_sampling.py::test_pruning_policy_changes_only_the_pruned_scale"]
TARGETS = [
    ("bench.models.generator", "Generator.sample_tokens", SAMPLING_TESTS),
    ("bench.models.generator", "Generator.generate", SAMPLING_TESTS),
    ("bench.prune", "keep_heads", PRUNE_TESTS),
    ("bench.prune", "keep_channels", PRUNE_TESTS),
    ("methods.magnitude", "Magnitude.scores", ["tests/test_methods.py"]),
]
# The token methods: each function with the tests of its method, chosen by pytest -k: the method's name
# matches test_<method>.py and the parametrised ids of the shared token-method tests; StepVAR's unit
# tests in tests/test_token_methods.py are named after what they test.
TOKEN_TESTS = ["tests/test_fastvar.py", "tests/test_lazyvar.py", "tests/test_token_methods.py",
               "tests/test_token_methods_t2i.py", "tests/test_token_methods_hart.py"]
TOKEN_FUNCTIONS = {
    "fastvar": ["pts_score", "parse_fractions", "parse_drop", "parse_layers", "FastVARPolicy.sublayer",
                "FastVARPolicy.pivotal", "FastVARPolicy.restore_cached", "FastVARPolicy.begin_scale",
                "FastVAR.schedule_for"],
    "lazyvar": ["update_index", "downsample", "owners", "select_group", "LazyVARPolicy.groups",
                "LazyVARPolicy._needs_index", "LazyVARPolicy.observe", "LazyVARPolicy.begin_group",
                "LazyVARPolicy.enter_scale", "LazyVAR.schedule_for"],
    "stepvar": ["texture_score", "structure_score", "unit_rank", "grid", "StepVARPolicy.scores",
                "StepVARPolicy.enter_scale", "StepVARPolicy.exit_scale", "StepVAR.schedule_for"],
    "tome": ["random2d_matching", "ToMePolicy.sublayer", "ToMe.apply"],
}
TOKEN_SELECT = {"stepvar": "stepvar or texture or structure or unit_rank or restoration or kept_set"}
TOKEN_TARGETS = [(f"methods.{m}", fn, TOKEN_TESTS + ["-k", TOKEN_SELECT.get(m, m)])
                 for m, fns in TOKEN_FUNCTIONS.items() for fn in fns]
# Tables, records and metrics: what turns runs into the numbers users read (relative cells, Kendall's tau,
# ranks and error bars, sharded merges, sweeps, fidelity metrics), each against its own test file.
_MJHQ_FAST = ["tests/test_mjhq.py", "-k", "read_meta or category_fids or clip_score or mjhq30k"]
INFRA_TARGETS = [(m, fn, [tests] if isinstance(tests, str) else tests) for m, fn, tests in [
    ("bench.render", "_derive", "tests/test_render.py"), ("bench.render", "_kendall", "tests/test_render.py"),
    ("bench.render", "_measure", "tests/test_render.py"), ("bench.render", "_cell_texts", "tests/test_render.py"),
    ("bench.render", "_fmt", "tests/test_render.py"),
    ("bench.shard", "assign", "tests/test_shard.py"), ("bench.shard", "finished", "tests/test_shard.py"),
    ("bench.shard", "merge", "tests/test_shard.py"), ("bench.shard", "merge_features", "tests/test_shard.py"),
    ("bench.shard", "n_batches", "tests/test_shard.py"),
    ("bench.sweep", "expand", "tests/test_sweep.py"), ("bench.sweep", "finished", "tests/test_sweep.py"),
    ("bench.sweep", "_names", "tests/test_sweep.py"),
    ("bench.leaderboard", "_aggregate", "tests/test_leaderboard.py"),
    ("bench.leaderboard", "_sort", "tests/test_leaderboard.py"), ("bench.leaderboard", "_cell", "tests/test_leaderboard.py"),
    ("bench.leaderboard", "_primary", "tests/test_leaderboard.py"),
    ("bench.leaderboard", "_number", "tests/test_leaderboard.py"),
    ("bench.leaderboard", "records_frame", "tests/test_leaderboard.py"),
    ("bench.metrics.fidelity", "evaluate", "tests/test_metrics.py"),
    ("bench.metrics.fidelity", "_compute", "tests/test_metrics.py"),
    ("bench.metrics.fidelity", "_check_inputs", "tests/test_metrics.py"),
    ("bench.metrics.pairs", "psnr", "tests/test_pairs.py"), ("bench.metrics.pairs", "ssim", "tests/test_pairs.py"),
    ("bench.metrics.pairs", "fid_star", "tests/test_pairs.py"),
    ("bench.metrics.mjhq", "category_fids", _MJHQ_FAST), ("bench.metrics.mjhq", "select", _MJHQ_FAST),
    ("bench.metrics.clip_score", "clip_score_metric", _MJHQ_FAST),
]]
# Run identity: method specs and their canonical spelling, sampling and seed checks, run keys, record
# validation, migration and lookup, staleness. A survivor here can make a table reuse the wrong record silently.
CORE_TESTS = ["tests/test_spec.py", "tests/test_record_checks.py", "tests/test_records.py", "tests/test_registry.py",
              "tests/test_cli_inputs.py", "tests/test_staleness.py", "tests/test_make_spec.py"]
CORE_TARGETS = [(m, fn, CORE_TESTS) for m, fns in [
    ("bench.spec", ["_canonical_value", "parse_method", "_text", "format_method", "parse_chain", "_convert",
                    "_range_text", "resolve_params", "resolve_method", "resolve_chain"]),
    ("bench.defaults", ["check_sampling", "model_sampling", "check_seed"]),
    ("bench.registry", ["did_you_mean"]),
    ("bench.records", ["_canonical_json", "RunSpec.__post_init__", "RunSpec.key_dict", "RunSpec.from_dict",
                       "RunSpec.key", "_json_ok", "_finite", "_metric", "make_record", "validate_record",
                       "_migrate_1_to_2", "upgrade_record", "read_record", "find_record", "record_paths",
                       "accounting_key", "load_accounting", "iter_records"]),
    ("bench.plan", ["check_chain_fits", "requested_chain", "make_spec", "_diff", "staleness", "match_records"]),
] for fn in fns] + [("bench.plan", fn, ["tests/test_render.py"]) for fn in ("table_cells", "unique_specs")]
# The structured pruners: OBS with compensation (EVAR, SlimGPT), their calibration Hessians, the gradient
# scores (Taylor, LLM-Pruner, OBA), the pruner base, and the distillation losses (PSAD, KD), each against
# its own tests. A survivor here is a method that prunes or distils differently from its paper. (Constructors
# that call super() are left out: their code has a __class__ cell the driver cannot swap.)
_OBS = ["tests/test_obs.py"]
_GRAD = ["tests/test_grad_methods.py"]
_DISTILL = ["tests/test_distill.py"]
_BASE = ["tests/test_methods.py", "tests/test_obs.py", "tests/test_grad_methods.py"]
PRUNING_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.obs", ["n_pruned", "dgs_sizes", "_cholesky", "struct_prune", "prune_heads", "prune_channels"], _OBS),
    ("bench.calib", ["decay_weights", "scale_weights", "Hessian.__init__", "Hessian.add", "Hessian.H",
                     "block0_inputs", "Stream.__init__", "Stream.__len__", "Stream.block_inputs", "Stream.collect"], _OBS),
    ("methods.evar", ["EVAR.calib_weights", "EVAR.prune"], _OBS),
    ("methods.slimgpt", ["SlimGPT.prune"], _OBS),
    ("bench.importance", ["prunable", "_flat", "_unflat", "calib_data", "split", "differentiating", "batch_grads",
                          "mean_grad", "fisher_diag", "batch_hvps", "zero_scores", "unit_sums"], _GRAD),
    ("methods.taylor", ["Taylor.scores"], _GRAD),
    ("methods.llm_pruner", ["LLMPruner.scores"], _GRAD),
    ("methods.oba", ["OBA.scores"], _GRAD),
    ("bench.method", ["StructuredPruner.sparsities", "StructuredPruner.apply",
                      "StructuredPruner.prune", "apply_chain"], _BASE),
    ("bench.method", ["split_for_ranks"], ["tests/test_shard.py", "-k", "split_into"]),
    ("bench.distill", ["param_groups", "train_drop_path", "drop_path_while_training", "train", "build_teacher",
                       "forward_pair", "scale_sizes", "per_scale_sum", "token_kl",
                       "token_ce", "token_terms", "scale_kl", "scale_ce_sum", "scale_ce"], _DISTILL),
    ("methods.psad", ["onsets", "gates", "scale_weights", "code_scale_weights", "paper_loss", "code_loss",
                      "PSAD.apply"], _DISTILL),
    ("methods.kd", ["kd_loss", "KD.apply"], _DISTILL),
] for fn in fns]
# What the cost columns are made of: parameter and FLOP counts, KV-cache sizes, the info contract, and the
# latency bench's statistics, per-scale attribution and report, each against its own tests.
_ACCOUNTING = ["tests/test_accounting.py", "tests/test_accounting_exact.py"]
_T2I_COUNTS = ["tests/test_accounting_exact.py", "-k", "t2i or decode"]
_HART_COUNTS = ["tests/test_accounting_exact.py", "-k", "hart"]
_LATENCY = ["tests/test_latency.py"]
MEASURE_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.accounting", ["_key", "count_params", "_meta_copy", "sampling_flops", "_per_scale_flops", "decode_flops",
                          "kv_cache_values", "info", "model_cost", "pass_starts"], _ACCOUNTING),
    ("bench.accounting", ["t2i_sampling_flops", "_t2i_count", "_shares", "t2i_decode_flops", "t2i_info"], _T2I_COUNTS),
    ("bench.accounting", ["_hart_count", "hart_info"], _HART_COUNTS),
    ("bench.latency", ["summarize"], _LATENCY + ["tests/test_latency_report.py", "-k", "summary or protocol or ci_is"]),
    ("bench.latency", ["speedup_ci"], ["tests/test_latency_report.py", "-k", "speedup_ci or report_in_full"]),
    ("bench.latency", ["Timer.seconds"], _LATENCY + ["-k", "clock or breakdown"]),
    ("bench.latency", ["report", "_criterion_text", "pass_model", "pass_cost_span", "predicted_scales_ms"],
     _LATENCY + ["tests/test_latency_report.py", "-k", "pass_model or pass_cost_span or report or per_scale"]),
    ("bench.latency", ["weights_mb", "timed_generation", "latency_conditions", "latency_specs", "timing_partners"],
     _LATENCY),
    ("bench.latency", ["use_cuda_device"], _LATENCY + ["-k", "indexed"]),
    ("bench.latency", ["warm_up", "measure", "peak_memory"], _LATENCY + ["tests/test_latency_report.py"]),
    ("bench.models.graphs", ["cuda_capture", "eager_capture", "fingerprint", "check_current_device", "pool_bytes",
                             "ScaleGraphs.__init__",
                             "ScaleGraphs.matches", "ScaleGraphs._warm_up", "ScaleGraphs._check", "ScaleGraphs._step",
                             "ScaleGraphs.run"],
     ["tests/test_fast_sampler.py", "tests/test_latency.py", "-k", "graph or cuda"]),
    ("bench.models.generator", ["Generator.scale_graphs"], ["tests/test_fast_sampler.py", "-k", "graph or cuda"]),
] for fn in fns]
# What the GenEval-style scores and the tiny worlds' ground truth are made of: the procedural datasets
# (tinyshapes, shapes scenes and their prompts), the scene detector and checker behind the tiny-t2i quality
# bars, GenEval's scoring rules, and the tiny feature network behind every tiny FID. A survivor here is a
# score that counts the wrong objects or a dataset that is not what its golden hash says.
_SCENES = ["tests/test_scenes.py"]
_GENEVAL = ["tests/test_geneval.py"]
_FEATURES = ["tests/test_metrics.py", "tests/test_features.py", "-k", "cnn or extractor or feature"]
SCORING_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.data.tinyshapes", ["class_name", "_chunk", "generate", "to_pm1"], ["tests/test_tinyshapes.py"]),
    ("bench.data.scenes", ["SceneSpec.__post_init__", "SceneSpec.count", "SceneSpec.prompt", "all_specs", "_pick",
                           "_uniform", "_shuffled", "sample_spec", "eval_prompts", "tokenize", "_box_rel", "_apart",
                           "_layout", "_place_free", "_place_position", "scene", "_appearance", "_shape_masks",
                           "_render", "generate", "object_tokens"], _SCENES),
    ("bench.data.scenes_detect", ["_hull_area", "_plane", "shape_features", "classify_shape", "_as_float_images",
                                  "noise_level", "colour_strength", "detect_one", "detect", "_centre",
                                  "relation_holds", "check"], _SCENES + _GENEVAL),
    ("bench.metrics.geneval", ["_options", "iou", "keep_detections", "relative_position", "evaluate",
                               "check_metadata", "read_metadata", "read_results", "summary"], _GENEVAL),
    ("bench.metrics.geneval_detectors", ["ShapesDetector.detect", "ShapesDetector.colours"], _GENEVAL),
    ("bench.metrics.geneval_detectors", ["ClipColours.__init__", "ClipColours.classifier", "ClipColours.crops",
                                         "ClipColours.colours", "Mask2FormerDetector.detect",
                                         "Mask2FormerDetector.colours"], ["tests/test_geneval_detectors.py"]),
    ("bench.metrics.features", ["TinyShapesCNN.__init__", "TinyShapesCNN.feature_dim", "TinyShapesCNN.normalize",
                                "TinyShapesCNN.features_from_float", "TinyShapesCNN.features", "TinyShapesCNN.logits",
                                "save_feature_cnn", "read_feature_cnn_metadata", "load_feature_cnn", "_existing_weights",
                                "_random_shift", "predict_logits", "accuracy", "train_feature_cnn",
                                "FeatureExtractorTinyShapesCNN.forward", "register_tinyshapes_extractor"], _FEATURES),
] for fn in fns]
# The text-to-image models (Infinity and its BSQ VAE, the tiny-t2i text encoder and sampler, HART and its
# tokenizer and diffusion head): each against its golden outputs from the official code and its own tests.
# A survivor here is a model that differs from the official one while its golden tests still pass.
_INF = ["tests/test_official_infinity.py", "tests/test_t2i.py", "tests/test_infinity_gaps.py"]
_HART = ["tests/test_hart.py"]
MODEL_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.models.infinity", ["rope2d_table", "apply_rope", "Rope.__init__", "RMSNorm.__init__",
                               "RMSNorm.forward", "packed", "CrossAttention.__init__", "CrossAttention.text_kv",
                               "CrossAttention.forward", "TextAttentivePool.__init__", "TextAttentivePool.forward",
                               "CrossAttnBlock.__init__", "Infinity.__init__",
                               "Infinity.block_list", "Infinity.encode_text", "Infinity.null_text",
                               "Infinity.run_blocks", "Infinity.kv_caching", "Infinity.forward", "adapt_state_dict"], _INF),
    # what only token methods reach: a subset's RoPE positions, the sub-layer names a policy routes
    ("bench.models.infinity", ["Rope.at", "CrossAttnBlock.forward"], _INF + ["tests/test_token_methods_t2i.py"]),
    ("bench.models.bsq", ["swish", "Normalize.__init__", "ResnetBlock.__init__", "ResnetBlock.forward",
                          "Downsample.__init__", "Downsample.forward", "Upsample.__init__", "Upsample.forward", "_levels",
                          "Encoder.__init__", "Encoder.forward", "Decoder.__init__", "Decoder.forward", "_resize",
                          "BSQ.__init__", "BSQ.quantize", "BSQ.bits_to_codes", "BSQVAE.__init__", "BSQVAE.quantize",
                          "BSQVAE.bits_to_latent", "BSQVAE.bits_to_var_input", "BSQVAE.requantize", "BSQVAE.decode",
                          "BSQVAE.adapt_state_dict"], _INF),
    ("bench.models.t2i", ["PromptGenerator.encode_prompts", "PromptGenerator.generate", "T2IGenerator.__init__",
                          "T2IGenerator.forward_teacher", "T2IGenerator._prefix", "T2IGenerator.token_ce",
                          "T2IGenerator.loss", "to_uint8_trunc"], _INF),
    # the tiny text encoder's layout pretraining (the tiny-t2i recipe's text_pretrain / layout_weight)
    ("bench.recipes.t2i_layout", ["layout_targets", "mean_pool", "LayoutHead.__init__", "LayoutHead.loss",
                                  "pretrain_text", "relation_probe"], ["tests/test_t2i_layout.py"]),
    # the cross-attention focus probe (where an object's tokens look in the prompt)
    ("bench.recipes.t2i_probe", ["object_cells", "attention_inputs", "cross_attention_probs", "attention_focus"],
     ["tests/test_t2i_probe.py"]),
    # the samplers' policy and prefix paths are reached by the token-method, LazyVAR and probe tests
    ("bench.models.t2i", ["T2IGenerator.sample_bits", "_check_leak"], _INF + ["tests/test_token_methods_t2i.py", "tests/test_lazyvar.py",
                                                              "tests/test_t2i_probe.py"]),
    ("bench.models.text", ["WordTokenizer.__call__", "TinyTextEncoder.__init__", "TinyTextEncoder.forward",
                           "TinyTextEncoder.encode"], ["tests/test_t2i.py", "tests/test_infinity_gaps.py"]),
    ("bench.models.hart_diffusion", ["space_timesteps", "cosine_betas", "RespacedSchedule.__init__", "modulate",
                                     "TimestepEmbedder.__init__", "TimestepEmbedder.sinusoid", "ResBlock.__init__",
                                     "ResBlock.forward", "FinalLayer.__init__", "FinalLayer.forward",
                                     "SimpleMLPAdaLN.__init__", "SimpleMLPAdaLN.forward", "DiffusionHead.__init__",
                                     "DiffusionHead._step", "DiffusionHead.sample"], _HART),
    ("bench.models.hart_vae", ["HybridQuantizer.phi", "HybridQuantizer._embed_BChw",
                               "HybridQuantizer.f_to_idx_and_residual", "HybridQuantizer.idx_to_var_input",
                               "HybridQuantizer.add_scale", "HybridQuantizer.idx_to_fhat", "HARTTokenizer.__init__",
                               "HARTTokenizer.adapt_state_dict"], _HART),
    ("bench.models.hart", ["rope_inv_freq", "rope_1d", "rope_2d", "rotate_half", "apply_rope", "image_positions",
                           "context_positions", "context_pool", "RMSNorm.__init__", "RMSNorm.forward",
                           "LlamaAttention.__init__", "LlamaAttention.forward", "LlamaMLP.__init__", "LlamaMLP.forward",
                           "AdaLNSelfAttn.__init__", "AdaLNSelfAttn.ada",
                           "AdaLNBeforeHead.__init__", "AdaLNBeforeHead.ada", "AdaLNBeforeHead.forward", "HART.__init__",
                           "HART.attach", "HART.tokenizer", "HART.kv_caching", "HART.forward", "HART.decode_uint8"],
     _HART),
    ("bench.models.hart", ["AdaLNSelfAttn.forward"], _HART + ["tests/test_token_methods_hart.py"]),
    ("bench.models.hart", ["HART.sample_tokens"], _HART + ["tests/test_token_methods_hart.py", "tests/test_lazyvar.py"]),
] for fn in fns]
# What stands between a user's files and a result: checkpoint reading, strict loading and its messages,
# manifests, atomic writes and build info, HART's config read from its checkpoint folder, the paper-world
# metric assets, and the Core ML export and op counts. A survivor here is a bad input that passes
# silently, a partial file, or a package whose ops are counted wrong.
_CKPT = ["tests/test_checkpoint.py", "tests/test_checkpoint_errors.py", "tests/test_assets.py", "tests/test_hart_runner.py"]
_IO = ["tests/test_io.py", "tests/test_records.py", "-k", "test_io or umask or installed_copy or roundtrip"]
_COREML = ["tests/test_coreml.py", "tests/test_table5.py"]
# without the tests that export a package first (12 s each): what runs on the traced modules and fakes
_COREML_FAST = _COREML + ["-k", "not export_and_op_counts and not cli_exports and not fresh_process and not cli_ops"]
_COREML_OPS = _COREML + ["-k", "export_and_op_counts or cli_ops or table5"]
PLUMBING_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.checkpoint", ["CheckpointMismatch.__init__", "ckpt_dir", "locate", "locate_all", "not_found",
                          "read_state_dict", "_first_line", "check_state_dict", "load_strict", "load_built",
                          "sha256", "check_manifest"], _CKPT),
    ("bench.io", ["_umask", "atomic_write_bytes", "atomic_write", "canonical_safetensors", "save_png", "read_image",
                  "atomic_write_text", "check_writable_dir", "check_writable_file", "_git", "build_info", "git_commit",
                  "git_dirty"], _IO),
    ("bench.models.hart_config", ["HARTTokenizerConfig.downsample", "HARTConfig.hart_0_7b", "HARTConfig.hd",
                                  "HARTConfig.vocab_size", "HARTConfig.Cvae", "HARTConfig.L", "HARTConfig.seq_len",
                                  "HARTConfig.ffn_hidden", "HARTConfig.image_size", "HARTConfig.from_dict"],
     ["tests/test_hart_config.py", "tests/test_hart.py", "tests/test_hart_runner.py", "tests/test_accounting_exact.py",
      "-k", "hart or config"]),
    # what reads and judges a checkpoint folder's config files
    ("bench.models.hart_config", ["HARTTokenizerConfig.problems", "HARTConfig.problems", "HARTConfig.check",
                                  "HARTConfig.from_pretrained_dir", "_read_json", "_pick", "checkpoint_files"],
     ["tests/test_hart_config.py", "tests/test_hart.py", "tests/test_hart_runner.py",
      "-k", "test_hart_config or pretrained or unsupported or default_guess or checkpoint_files or tokenizer_refuses"]),
    ("bench.metrics.paper", ["_torch_hub_checkpoints", "resolve_inception_weights", "extract_inception_features",
                             "resolve_adm_reference", "read_adm_reference", "adm_reference_features", "evaluate_adm"],
     ["tests/test_paper_assets.py", "tests/test_metrics.py"]),
    ("bench.coreml", ["interp_matrix", "init_states", "_Export.__init__", "_Export.add_scale", "_attention",
                      "ScaleStep.__init__", "ScaleStep.forward", "Decode.forward", "steps", "example_inputs",
                      "require_macos", "check_compute_units", "placement", "CoreMLGenerator.__init__",
                      "CoreMLGenerator.sample_tokens", "CoreMLGenerator.fhat_to_img", "CoreMLGenerator.generate"],
     _COREML_FAST),
    ("bench.coreml", ["_ops", "op_counts", "total_ops", "weights_bytes"], _COREML_OPS),
    ("bench.coreml", ["_ct", "export"], _COREML),
] for fn in fns]
# What turns a run spec into its record: the runner (reuse, preflight, the chain, sampling by batches and
# chunks, metric and cost fields, timings), the original model's cached outputs for FID*, and the benches
# (labels, seeds per batch, n checks, identity and protocol, folder layouts and resume). A survivor here is a
# record whose numbers or settings are not what was run.
_RUNNER = ["tests/test_runner_fields.py", "tests/test_runner.py"]
_MJHQ_BENCH = ["tests/test_mjhq.py", "-k", "not fid_star and not fidelity_on and not fastvars_layout"]
_ORIGINALS = ["tests/test_originals.py", "tests/test_mjhq.py", "-k", "originals or fidelity or fid_star"]
RUNS_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.runner", ["sample"], ["tests/test_runner.py", "-k", "sample_features"]),
    ("bench.runner", ["sample_features"], ["tests/test_runner.py", "tests/test_runner_fields.py", "-k",
                                           "sample_features or test_runner_fields"]),
    ("bench.runner", ["cached_data"], ["tests/test_runner.py", "-k", "tokenised"]),
    ("bench.runner", ["_refuse_newer"], ["tests/test_runner_fields.py", "-k", "newer_schema"]),
    ("bench.benches.geneval", ["_GenEvalBench.coverage_note"], ["tests/test_geneval.py", "tests/test_runner_fields.py",
                                                                "-k", "coverage or feature_rows"]),
    ("bench.runner", ["bench_of", "preflight", "run"], _RUNNER),
    ("bench.runner", ["prepared_generator"], ["tests/test_runner_fields.py", "tests/test_latency.py", "-k",
                                              "prepared_generator or test_latency"]),
    ("bench.runner", ["account"], ["tests/test_render.py", "tests/test_runner_fields.py", "-k", "weight_free"]),
    ("bench.originals", ["original_spec", "folder", "image_path", "load_images", "complete", "ensure", "pair_rows",
                         "pair_metrics"], _ORIGINALS),
    ("bench.benches.base", ["Bench.__init__", "Bench.check_fidelity", "Bench.labels", "Bench.check_n",
                            "Bench.batch_seed", "Bench.identity", "Bench.args_from_protocol", "Bench.preflight",
                            "Bench.evaluate", "Bench.lpips_weights", "Bench.fidelity_metrics"], ["tests/test_bench_base.py"]),
    ("bench.benches.geneval", ["_shapes_row", "shapes_metadata", "official_metadata", "prompt_dir", "write_prompt",
                               "_samples", "prompt_complete", "scan_folder", "generate_folder", "score_images",
                               "score_folder", "metrics_of", "_GenEvalBench.rows", "_GenEvalBench.check_n",
                               "_GenEvalBench.labels", "_GenEvalBench.evaluate", "GenEval.preflight"],
     ["tests/test_geneval.py"]),
    ("bench.benches.mjhq", ["_MJHQBench.check_n", "_MJHQBench.chosen", "_MJHQBench.labels",
                            "_MJHQBench.label_categories", "_MJHQBench.score", "ShapesMJHQ.prompt_table",
                            "MJHQ30K.preflight", "MJHQ30K.score"], _MJHQ_BENCH),
    ("bench.benches.mjhq", ["image_path", "_existing", "generate_folder", "score_folder"],
     ["tests/test_mjhq.py", "-k", "fastvars_layout or mjhq_folder"]),
    ("bench.benches.mjhq", ["_MJHQBench.fidelity_metrics"], ["tests/test_mjhq.py", "-k", "fid_star"]),
    ("bench.benches.shapes_c2i", ["TinyFeatureBench.identity", "TinyFeatureBench.preflight", "ShapesC2I.features",
                                  "ShapesC2I.score", "ShapesC2I.data"], ["tests/test_bench_base.py"]),
    ("bench.benches.imagenet256", ["ImageNet256.data"], ["tests/test_bench_base.py", "-k", "imagenet"]),
    ("bench.benches.latency", ["available_cpus", "LatencyBench.__init__", "LatencyBench.identity",
                               "LatencyBench.check_n", "LatencyBench.args_from_protocol"], ["tests/test_latency.py"]),
] for fn in fns]
# What a user types and reads: the commands behind `varbench` (their checks, the order of their work, what
# they print and return), where the package finds its data and writes by default, the sample grid, and the
# metric catalogue. Each against the tests that call that command through bench.cli.main in-process. A
# survivor here is a wrong message, exit code or printed number, or a file written to the wrong place. (`info`'s
# tests, ~20 s, run only against the commands that print it.)
_SURFACE = ["tests/test_cli_surface.py", "tests/test_cli_inputs.py", "tests/test_registry.py"]
_INFO = ["tests/test_cli_info.py"] + _SURFACE + [f"tests/test_accounting.py::{t}" for t in (
    "test_info_json_contract", "test_info_with_a_structural_method_matches_the_paper_sizes",
    "test_kv_cache_holds_only_the_tokens_a_token_method_computes")] + [f"tests/test_t2i.py::{t}" for t in (
    "test_info_json_tiny_t2i_contract", "test_info_json_infinity_2b_and_hart", "test_sample_cli_bad_inputs")] + [
    "tests/test_cli_prompts.py"]
_INFO_T2I = ["tests/test_cli_info.py::test_info_text_of_tiny_t2i", "tests/test_t2i.py::test_info_json_tiny_t2i_contract",
             "tests/test_t2i.py::test_info_json_infinity_2b_and_hart"]
_INFO_HART = ["tests/test_cli_info.py::test_info_text_of_hart", "tests/test_t2i.py::test_info_json_infinity_2b_and_hart"]
_STALE = "tests/test_runner.py::test_a_changed_method_makes_its_record_stale_and_reruns"
_TABLE = ["tests/test_cli_table.py"] + _SURFACE + ["tests/test_runner.py::test_table_command_renders_records_and_says_why_rows_are_empty",
                     "tests/test_runner.py::test_unknown_table_name", "tests/test_table5.py",
                     "tests/test_render.py::test_the_table_command_times_a_tables_latency_cells_together",
                     "tests/test_render.py::test_weight_free_accounting_fills_params_anywhere_and_a_run_record_wins"]
_LATENCY_CLI = ["tests/test_cli_timing.py"] + _SURFACE + [f"tests/test_latency.py::{t}" for t in (
    "test_cli_compares_two_chains_writes_records_and_reuses_them", "test_random_weights_records_name_no_file_and_are_not_stale",
    "test_bad_latency_arguments_are_one_clear_line", "test_compile_is_refused_for_core_ml",
    "test_more_threads_than_usable_cpus_is_warned_before_timing", "test_every_setting_refused_in_full",
    "test_text_to_image_models_are_timed_on_the_worlds_geneval_prompts",
    "test_cuda_graphs_refuse_text_to_image_models_and_token_methods")] + [
    "tests/test_coreml.py::test_latency_cli_on_coreml_with_the_runtime_faked"]
_COREML_CLI = _SURFACE + ["tests/test_coreml.py::test_cli_ops_and_bad_input",
                          "tests/test_coreml.py::test_cli_exports_tiny_var_dense_and_pruned"]
_FOLDERS = _SURFACE + ["tests/test_cli_prompts.py", "tests/test_geneval.py::test_cli_import_and_bad_options",
                       "tests/test_mjhq.py::test_folders_in_fastvars_layout_score_like_the_run"]
SURFACE_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.commands.common", ["human", "takes_prompts", "prompt_models", "sampling_overrides", "device_for",
                               "load_records", "age", "parse_seed"],
     _SURFACE + ["tests/test_leaderboard.py", "tests/test_t2i.py::test_sample_cli_bad_inputs", "tests/test_cli_prompts.py"]),
    ("bench.cli", ["main", "_dispatch"], _SURFACE),
    ("bench.recipes.tiny", ["checked_stages", "missing_inputs"],
     ["tests/test_tiny_recipes.py::test_train_tiny_refuses_what_it_could_not_finish_before_training",
      "tests/test_tiny_recipes.py::test_tiny_t2i_refuses_stages_whose_inputs_are_missing",
      "tests/test_tiny_recipes.py::test_tiny_t2i_refuses_a_file_as_out"]),
    ("bench.commands.models", ["cmd_list"], _SURFACE),
    ("bench.commands.models", ["cmd_info", "_kv_row", "_print_info"], _INFO),
    ("bench.commands.models", ["_on_meta"], _INFO_T2I + _INFO_HART),
    ("bench.commands.models", ["_info_t2i"], _INFO_T2I),
    ("bench.commands.models", ["_info_hart"], _INFO_HART),
    ("bench.commands.models", ["cmd_sample"], ["tests/test_cli_prompts.py", "tests/test_t2i.py::test_sample_cli_bad_inputs"]),
    ("bench.commands.runs", ["cmd_run"], _SURFACE + ["tests/test_latency.py::test_run_refuses_the_latency_bench",
                                                     "tests/test_runner.py::test_an_altered_checkpoint_is_refused"]),
    ("bench.commands.runs", ["cmd_sweep"], ["tests/test_sweep.py"]),
    ("bench.commands.runs", ["cmd_runs"], _SURFACE + [_STALE, "tests/test_mjhq.py::test_fidelity_on_a_class_conditional_bench"]),
    ("bench.commands.tables", ["cmd_table"], _TABLE),
    ("bench.commands.tables", ["cmd_figures"], _SURFACE + [
        "tests/test_figures.py::test_cli_renders_all_figures", "tests/test_figures.py::test_missing_records_and_unknown_figures_are_clear",
        "tests/test_figures_ablation.py::test_cli_draws_the_figures_it_can_and_reports_the_token_figure"]),
    ("bench.commands.tables", ["cmd_leaderboard"], _SURFACE + ["tests/test_leaderboard.py"]),
    ("bench.commands.timing", ["cmd_latency", "_check_graphs", "_check_class_conditional"], _LATENCY_CLI),
    ("bench.commands.timing", ["cmd_coreml"], _COREML_CLI),
    ("bench.commands.folders", ["_geneval_print", "_folder_bench", "_geneval_bench", "_folder_generator",
                                "cmd_geneval_import", "cmd_geneval_score", "cmd_geneval_generate", "_mjhq_bench",
                                "cmd_mjhq_generate", "cmd_mjhq_score"], _FOLDERS),
    ("bench.resources", ["_is_checkout", "resource_dir", "tiny_assets_dir", "results_root", "tables_out_dir",
                         "figures_out_dir"], _SURFACE + ["tests/test_render.py", "tests/test_resources.py"]),
    ("bench.image_grid", ["save_grid"], _SURFACE),
    ("bench.metrics.catalog", ["MetricInfo.__post_init__", "MetricInfo.higher_is_better", "MetricInfo.__call__"],
     _SURFACE + ["tests/test_leaderboard.py", "tests/test_layers.py"]),
] for fn in fns]
# The ablation and trade-off figures: which records become which points, bars and panels, the Pareto front,
# sweep series and their labels, a table's cells as bars, PSAD's gate curves, the spec checks and the empty-
# figure messages, the files written. Against the figure tests, which read the plotted data off the Axes. A
# survivor here is a point drawn from the wrong record, a wrong front or curve, or a bad spec let through.
_FIG_P, _FIG_A = "tests/test_figures.py", "tests/test_figures_ablation.py"   # pareto/latency kinds; sweep, bars, gates
_FIG_S = ["tests/test_figures_specs.py", "tests/test_figures_data.py"]   # spec checks, hand-made records: ~2 s, first
FIGURE_TARGETS = [(m, fn, tests) for m, fns, tests in [
    ("bench.figures", ["figures_dir", "figure_names", "load_figure", "_for_world", "_check_metric", "_chain", "_short",
                       "_defaults", "describe", "_ylabel", "_where", "_newer", "_point", "_style", "figure", "render"],
     _FIG_S + [_FIG_P, _FIG_A]),
    ("bench.figures", ["_latency_records", "_left_out", "pareto_points", "_pareto", "short_labels", "pareto_front", "_check_pareto", "_draw_pareto",
                       "_scales_hw", "_draw_scale_latency"], _FIG_S + [_FIG_P]),
    ("bench.figures", ["_check_sweep", "_swept", "sweep_series", "_sweep_empty", "_draw_sweep", "_check_table_bars",
                       "table_bars_data", "_draw_table_bars", "gate_onsets", "gate_values", "_check_gates",
                       "gate_schedules", "_draw_gates"], _FIG_S + [_FIG_A]),
] for fn in fns]
# Model cards and configs: the official sizes (VAR width 64·depth; Infinity-2B head dim 128, FFN 8192, pool
# heads), pruned per-block sizes, Infinity's scale schedules, image sizes, where a card looks for its files and
# what a missing one's error says, strict loading of the shipped tiny files, the data's token pyramids. Against
# tests/test_cards.py (torch-free, < 1 s) and test_zoo.py first, then the loaders' own tests.
_CARDS = ["tests/test_cards.py", "tests/test_zoo.py"]
CARDS_TARGETS = [(m, fn, tests) for m, fns, tests in [
    # (replace and to_dict are one-line returns: no mutant; tests/test_cards.py checks them)
    ("bench.models.configs", ["VARConfig.official", "VARConfig.block_heads", "VARConfig.block_ffn", "VARConfig.hd",
                              "VARConfig.L"], _CARDS + ["tests/test_checkpoint.py"]),
    ("bench.models.configs", ["infinity_schedule", "InfinityConfig.infinity_2b", "InfinityConfig.hd",
                              "InfinityConfig.ffn_hidden", "InfinityConfig.pool_heads", "InfinityConfig.L",
                              "InfinityConfig.image_size"], _CARDS + ["tests/test_t2i.py", "tests/test_infinity_gaps.py"]),
    ("bench.models.cards", ["tiny_put"], ["tests/test_cards.py", "tests/test_bench_base.py", "-k",
                                          "missing or feature"]),
    ("bench.models.cards", ["ModelCard.scales_hw", "T2ICard.scales_hw", "HARTCard.scales_hw"],
     ["tests/test_zoo.py", "tests/test_figures_data.py", "-k", "scales or build_random"]),
    ("bench.models.cards", ["ModelCard.image_size", "ModelCard.folder", "ModelCard.files", "ModelCard.identity",
                            "ModelCard.build", "ModelCard.__call__", "T2ICard.image_size", "T2ICard.folder",
                            "T2ICard.files", "T2ICard.identity", "T2ICard.build", "T2ICard.__call__",
                            "HARTCard.folder", "HARTCard.config", "HARTCard.image_size", "HARTCard.files",
                            "HARTCard.identity", "HARTCard.build", "HARTCard.__call__", "HARTCard.text_encoder"],
     _CARDS + ["tests/test_hart_runner.py"]),
    ("bench.models.zoo", ["build", "load", "load_vae", "load_var", "load_generator", "build_t2i", "load_bsq", "load_t2i"],
     _CARDS + ["tests/test_checkpoint.py", "tests/test_t2i.py"]),
    ("bench.data.tokens", ["tokenize_images"], ["tests/test_tokens.py"]),
] for fn in fns]
DESELECT = ["tests/test_methods.py::test_ft_lowers_the_training_loss"]
# matplotlib keywords whose values are looks only (what is drawn, where, and in which colour or line style
# stays mutated: x/y data, labels, colours, ls, markers, the note's position, tight_layout's rect, dpi)
STYLE_KWARGS = {"capsize", "elinewidth", "lw", "linewidth", "ms", "markersize", "mew", "fontsize", "alpha", "zorder",
                "pad", "rotation", "xytext", "textcoords", "bbox", "error_kw", "ncol", "bbox_to_anchor", "frameon",
                "loc", "ha", "style", "hatch", "figsize"}

SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
            ast.FloorDiv: ast.Div, ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv, ast.MatMult: ast.Mult}
SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}


def _const_mutations(v):
    if isinstance(v, bool):
        return [not v]
    if isinstance(v, int):
        return [v + 1] if v != 1 else [2, 0]
    if isinstance(v, float):
        return [v + 1.0, 0.0] if v != 0 else [1.0]
    if isinstance(v, str) and v:
        return ["XX" + v + "XX"]
    return []


def _set_op(n, op):
    n.op = op()


def _set_cmp(n, j, op):
    n.ops[j] = op()


def mutants_of(fn_node: ast.FunctionDef):
    """Yield (lineno, description, mutated function node)."""
    body_nodes = [n for stmt in fn_node.body for n in ast.walk(stmt)]
    # skip the docstring
    if fn_node.body and isinstance(fn_node.body[0], ast.Expr) and isinstance(fn_node.body[0].value, ast.Constant):
        doc = fn_node.body[0].value
    else:
        doc = None
    style = {id(c) for kw in body_nodes if isinstance(kw, ast.keyword) and kw.arg in STYLE_KWARGS
             for c in ast.walk(kw.value) if isinstance(c, ast.Constant)}
    for i, node in enumerate(body_nodes):
        edits = []
        if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
            new_op = SWAP_BIN[type(node.op)]
            edits.append((f"{type(node.op).__name__} -> {new_op.__name__}", partial(_set_op, op=new_op)))
        elif isinstance(node, ast.AugAssign) and type(node.op) in SWAP_BIN:
            new_op = SWAP_BIN[type(node.op)]
            edits.append((f"{type(node.op).__name__}= -> {new_op.__name__}=", partial(_set_op, op=new_op)))
        elif isinstance(node, ast.Compare):
            for j, op in enumerate(node.ops):
                if type(op) in SWAP_CMP:
                    new_op = SWAP_CMP[type(op)]
                    edits.append((f"{type(op).__name__} -> {new_op.__name__}", partial(_set_cmp, j=j, op=new_op)))
        elif isinstance(node, ast.BoolOp):
            other = ast.Or if isinstance(node.op, ast.And) else ast.And
            edits.append((f"{type(node.op).__name__} -> {other.__name__}", partial(_set_op, op=other)))
        elif isinstance(node, ast.Constant) and node is not doc and id(node) not in style:
            for new in _const_mutations(node.value):
                edits.append((f"{node.value!r} -> {new!r}", lambda n, v=new: setattr(n, "value", v)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            edits.append((f"drop unary {type(node.op).__name__}", "unwrap"))
        elif isinstance(node, ast.If):
            edits.append(("if cond -> if not cond", lambda n: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test))))
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.Return, ast.FunctionDef, ast.Pass)) and \
                not (isinstance(node, ast.Expr) and node.value is doc):
            edits.append(("delete statement", "delete"))
        for desc, edit in edits:
            new_fn = copy.deepcopy(fn_node)
            target = [n for stmt in new_fn.body for n in ast.walk(stmt)][i]
            if edit == "unwrap" or edit == "delete":
                _replace(new_fn, target, target.operand if edit == "unwrap" else ast.Pass())
            else:
                edit(target)
            ast.fix_missing_locations(new_fn)
            yield node.lineno, desc, new_fn


def _replace(root, old, new):
    for parent in ast.walk(root):
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for k, v in enumerate(value):
                    if v is old:
                        value[k] = new
                        return
            elif value is old:
                setattr(parent, field, new)
                return
    raise RuntimeError("node not found")


def _codes(code):
    """A code object and every code object nested in it."""
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_consts"):
            yield from _codes(c)


def mutant_code(fn, new_fn: ast.FunctionDef, path: str):
    """The code object of a mutated function, compiled so that its free variables are those of ``fn``
    (same names, same order: CPython sorts them), so that it runs with ``fn``'s own closure cells. A method
    calling ``super()`` has the free variable ``__class__``, which only a class body supplies; closure
    variables are supplied by an enclosing function that binds the same names."""
    free = fn.__code__.co_freevars
    if free:   # names a mutant no longer uses (a deleted ``super().__init__()``) stay free: unreachable uses
        new_fn = copy.deepcopy(new_fn)
        new_fn.body.insert(0, ast.parse(f"if False:\n    ({', '.join(free)},)").body[0])
    src = ast.unparse(new_fn)
    if "__class__" in free:
        src = "class _Mutant:\n" + textwrap.indent(src, "    ")
    others = [n for n in free if n != "__class__"]
    if others:
        src = "def _mutant_scope():\n" + "".join(f"    {n} = None\n" for n in others) + \
            textwrap.indent(src, "    ") + "\n    return None\n"
    code = compile(src, path, "exec")
    return next(c for c in _codes(code) if c.co_name == fn.__name__ and c is not code)


def resolve(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, property):   # a property's getter is mutated like any method
        obj = obj.fget
    obj = inspect.unwrap(obj)
    return getattr(obj, "__func__", obj)   # a classmethod: the function (a bound method has no settable __code__)


def run_tests(tests, fn=None, new_code=None, timeout=600.0, deselect=DESELECT):
    """Fork; in the child swap the code and run pytest. Returns ('killed'|'survived'|'timeout'|'error', s)."""
    t0 = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            if fn is not None:
                try:
                    fn.__code__ = new_code
                except Exception:   # the mutant could not be put in place: an error, never a kill
                    os._exit(98)
            import pytest
            args = ["-x", "-q", "-p", "no:cacheprovider", *tests]
            for d in deselect:
                args += ["--deselect", d]
            rc = pytest.main(args)
        except BaseException:
            rc = 99
        os._exit(int(rc))
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            return ("survived" if rc == 0 else "killed" if rc in (1, 99) or rc < 0 else f"error(rc={rc})",
                    time.time() - t0)
        if time.time() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.time() - t0
        time.sleep(0.05)


# The driver's groups: flag → (targets, results file under mutants/, label, --help text; `make mutation-FLAG`
# runs the group). No flag: decorated.
GROUPS = {
    "decorated": (TARGETS, "decorated-results.json", "decorated functions", ""),
    "tokens": (TOKEN_TARGETS, "token-results.json", "token methods",
               "the token methods' functions (FastVAR, LazyVAR, StepVAR, ToMe)"),
    "infra": (INFRA_TARGETS, "infra-results.json", "tables and metrics",
              "table rendering, sharding, sweeps, the leaderboard and the fidelity metrics"),
    "core": (CORE_TARGETS, "core-results.json", "specs and records",
             "run identity: method specs, sampling and seed checks, run keys, record validation, lookup and staleness"),
    "pruning": (PRUNING_TARGETS, "pruning-results.json", "pruners and distillation",
                "the structured pruners: OBS and its calibration, gradient scores, the pruner base, distillation losses"),
    "measure": (MEASURE_TARGETS, "measure-results.json", "costs and latency",
                "the cost columns: parameter and FLOP counts, KV-cache sizes, latency statistics and report"),
    "models": (MODEL_TARGETS, "models-results.json", "text-to-image models",
               "the text-to-image models against their golden outputs: Infinity, its BSQ VAE, the tiny text encoder "
               "and sampler, HART, its tokenizer and diffusion head"),
    "plumbing": (PLUMBING_TARGETS, "plumbing-results.json", "checkpoints, files and Core ML",
                 "checkpoint reading and strict loading, manifests, atomic writes and build info, HART's config "
                 "from its folder, the paper-world metric assets, the Core ML export and op counts"),
    "runs": (RUNS_TARGETS, "runs-results.json", "runs and benches",
             "spec to record: the runner's reuse, preflight, sampling, metric, cost and timing fields, the original "
             "model's cached outputs for FID*, the benches' labels, seeds, checks and folder layouts"),
    "surface": (SURFACE_TARGETS, "surface-results.json", "commands and their output",
                "what a user types and reads: the varbench commands' checks, messages, exit codes and printed "
                "numbers, the default folders and the package's data, the sample grid, the metric catalogue"),
    "figures": (FIGURE_TARGETS, "figures-results.json", "figures",
                "the ablation and trade-off figures: points, fronts, sweep series, table bars, gate curves, spec "
                "checks and empty-figure messages"),
    "cards": (CARDS_TARGETS, "cards-results.json", "model cards and configs",
              "the models' configs and cards: official sizes, pruned block sizes, Infinity's schedules, image "
              "sizes, where files are looked for and what a missing one says, building and strict loading, the "
              "data's token pyramids"),
    "scoring": (SCORING_TARGETS, "scoring-results.json", "datasets and scoring",
                "the procedural datasets, the scene detector, GenEval's scoring rules and colour classifier, the "
                "tiny feature network"),
}
RECHECK = os.path.join("mutants", "recheck-results.json")
# Second tier: the slow tests that [tool.mutmut] leaves out, run only on mutmut's survivors.
SLOW_SAMPLING = ["tests/test_sampling.py::test_identity_policy_is_bit_identical_and_sees_every_sublayer",
                 "tests/test_sampling.py::test_same_seed_same_images_different_seed_different",
                 "tests/test_sampling.py::test_generated_images_decode_the_sampled_tokens"]
SLOW_PRUNE = ["tests/test_checkpoint.py::test_pruned_model_loads_back_with_the_same_logits",
              "tests/test_methods.py::test_chain_applies_left_to_right_and_returns_the_pruned_model",
              "tests/test_registered.py"]
RECHECK_SCOPE = [  # (mutant-name prefix, slow tests)
    ("bench.models.generator.", SLOW_SAMPLING + ["tests/test_registered.py"]),
    ("bench.models.policy.", SLOW_SAMPLING),
    ("bench.models.var.", SLOW_SAMPLING),
    ("bench.models.vqvae.x_phi_index_map", SLOW_SAMPLING),
    ("bench.models.vqvae.xǁMultiScaleQuantizerǁ", SLOW_SAMPLING),
    ("bench.models.vqvae.xǁ_PhiListǁ", SLOW_SAMPLING),
    ("bench.models.vqvae.xǁPhiǁ", SLOW_SAMPLING),
    ("bench.prune.", SLOW_PRUNE),
    ("methods.magnitude.", SLOW_PRUNE),
    ("methods.ft.", ["tests/test_methods.py::test_ft_lowers_the_training_loss"]),
]
MUTMUT_STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
                 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
                 37: "caught by type check", None: "not checked"}


def _mutmut_codes():
    for dirpath, _, files in os.walk("mutants"):
        for f in sorted(files):
            if f.endswith(".py.meta"):
                path = os.path.relpath(os.path.join(dirpath, f[:-5]), "mutants")
                yield path, json.load(open(os.path.join(dirpath, f)))["exit_code_by_key"]


def recheck():
    """Run the slow tests on mutmut's survivors and untested mutants (in mutants/, the mutant chosen by MUTANT_UNDER_TEST)."""
    todo = []
    done = json.load(open(RECHECK)) if os.path.exists(RECHECK) else {}   # cached: only new survivors
    for _, codes in _mutmut_codes():
        for name, code in sorted(codes.items()):
            # "no tests": mutmut's fast selection never reaches the function (ft's only test is slow)
            if MUTMUT_STATUS.get(code) in ("survived", "no tests") and name not in done:
                tests = next((t for prefix, t in RECHECK_SCOPE if name.startswith(prefix)), None)
                if tests:
                    todo.append((name, tests))
    os.chdir("mutants")
    sys.path.insert(0, os.getcwd())
    import torch
    torch.set_num_threads(1)
    import bench.models.generator  # noqa: F401  (from mutants/: the trampolined copy)
    print(f"rechecking {len(todo)} survivors with the slow tests", flush=True)
    for name, tests in todo:
        os.environ["MUTANT_UNDER_TEST"] = name
        status, dt = run_tests(tests, timeout=300, deselect=())
        done[name] = status
        print(f"  {status:9s} {dt:5.1f}s  {name}", flush=True)
        with open(os.path.join("..", RECHECK), "w") as f:
            json.dump(done, f, indent=1)
    os.environ.pop("MUTANT_UNDER_TEST", None)
    os.chdir(ROOT)


def summary():
    """Per-file counts of mutmut's results (mutants/**/*.py.meta) and of this driver's, survivors listed."""
    per_file, survivors = {}, []
    rechecked = json.load(open(RECHECK)) if os.path.exists(RECHECK) else {}
    for path, codes in _mutmut_codes():
        if not codes:
            continue
        c = per_file.setdefault(path + " (mutmut)", {})
        for name, code in sorted(codes.items()):
            st = MUTMUT_STATUS.get(code, "suspicious")
            if st in ("survived", "no tests") and name in rechecked:
                st = {"killed": "killed by slow tests", "survived": "survived (slow tests too)"}.get(
                    rechecked[name], rechecked[name])
            c[st] = c.get(st, 0) + 1
            if not st.startswith("killed") and st != "caught by type check":
                survivors.append(f"{st}: {name}")
    for _, results, label, _ in GROUPS.values():
        results = os.path.join("mutants", results)
        for r in (json.load(open(results)) if os.path.exists(results) else []):
            c = per_file.setdefault(r["file"] + f" ({label}, tests/mutation/run.py)", {})
            c[r["status"]] = c.get(r["status"], 0) + 1
            if r["status"] != "killed":
                survivors.append(f"{r['status']}: {r['tag']}")
    all_k = all_t = 0
    print("mutation score per file (killed / total):")
    for key in sorted(per_file):
        c = per_file[key]
        k, t = c.get("killed", 0) + c.get("killed by slow tests", 0), sum(c.values())
        all_k, all_t = all_k + k, all_t + t
        print(f"  {key}: {k}/{t}  (" + ", ".join(f"{s} {n}" for s, n in sorted(c.items())) + ")")
    print(f"mutation score: {all_k}/{all_t} killed ({100 * all_k / max(all_t, 1):.1f}%)")
    print(f"not killed ({len(survivors)}; inspect a mutmut one with `.venv/bin/mutmut show NAME`):")
    for s in survivors:
        print("  " + s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--summary", action="store_true", help="print the per-file scores and survivors, run nothing")
    ap.add_argument("--recheck", action="store_true", help="run the slow tests on mutmut's survivors")
    ap.add_argument("--only", default="", help="run only targets whose name contains this (several: comma-separated; "
                    "NAME$: the function NAME only, e.g. figure$ but not figures_dir)")
    group = ap.add_mutually_exclusive_group()
    for flag, (_, _, _, text) in list(GROUPS.items())[1:]:
        group.add_argument(f"--{flag}", dest="group", action="store_const", const=flag,
                           help=f"{text} (make mutation-{flag})")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--survivors", action="store_true",
                    help="run only the mutants the group's results file does not list as killed (after new tests); "
                         "the killed ones keep their records")
    args = ap.parse_args()
    os.chdir(ROOT)
    if args.summary:
        return summary()
    if args.recheck:
        return recheck()
    sys.path.insert(0, ROOT)
    import torch
    torch.set_num_threads(1)
    totals = {}
    survivors, records = [], []
    targets, out, label, _ = GROUPS[args.group or "decorated"]
    out = os.path.join("mutants", out)
    previous: dict = {}   # --survivors: tag -> earlier statuses, in order (a tag can repeat within a line)
    if args.survivors and os.path.exists(out):
        with open(out) as f:
            for r in json.load(f):
                previous.setdefault(r["tag"], []).append(r)
    def save():
        """Write the records so far; called after each function, so that a stopped run keeps what it measured.
        --only and --survivors replace the run functions' records and keep the rest (a long run can be done in
        parts); the file is re-read under a lock each time, so drivers running disjoint --only sets at once keep
        each other's records."""
        import fcntl

        from bench.io import atomic_write_bytes
        run = {(r["file"], r["function"]) for r in records}
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            earlier = []
            if (args.only or args.survivors) and os.path.exists(out):
                with open(out) as f:
                    earlier = json.load(f)
            kept = [r for r in earlier
                    if (r["file"], r.get("function", r["tag"].split(" ")[1].rstrip(":"))) not in run]
            atomic_write_bytes(out, json.dumps(kept + records, indent=1).encode())

    for module, qualname, tests in targets:
        name = f"{module}.{qualname}"
        if not any(name.endswith("." + part[:-1]) if part.endswith("$") else part in name
                   for part in args.only.split(",")):
            continue
        fn = resolve(module, qualname)
        src_lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(src_lines)))
        fn_node = tree.body[0]
        fn_node.decorator_list = []
        ast.increment_lineno(fn_node, first - 1)
        path = inspect.getsourcefile(fn)
        muts = list(mutants_of(fn_node))
        if args.list:
            for line, desc, _ in muts:
                print(f"{os.path.relpath(path, ROOT)}:{line} {qualname}: {desc}")
            continue
        counts = totals.setdefault(os.path.relpath(path, ROOT) + "::" + qualname, {})
        todo = []
        for line, desc, new_fn in muts:
            tag = f"{os.path.relpath(path, ROOT)}:{line} {qualname}: {desc}"
            earlier_rec = previous[tag].pop(0) if previous.get(tag) else None
            if args.survivors and earlier_rec is not None and earlier_rec["status"] == "killed":
                counts["killed"] = counts.get("killed", 0) + 1
                records.append(earlier_rec)
            else:
                todo.append((new_fn, tag))
        if not todo:
            continue
        status, base = run_tests(tests)
        if status != "survived":
            print(f"{name}: the unmutated tests do not pass ({status}); skipped", flush=True)
            # --survivors: the killed records carried over are dropped again (the file keeps them)
            records[:] = [r for r in records if r.get("function") != qualname or r["file"] != os.path.relpath(path, ROOT)]
            totals.pop(os.path.relpath(path, ROOT) + "::" + qualname, None)
            continue
        limit = 3 * base + 10
        print(f"{name}: {len(todo)} of {len(muts)} mutants, clean run {base:.1f}s, timeout {limit:.0f}s", flush=True)
        for new_fn, tag in todo:
            try:
                fn_code = mutant_code(fn, new_fn, path)
            except SyntaxError as e:   # e.g. a deleted binding that a `nonlocal` names: not a program, not scored
                print(f"  skipped (does not compile: {e.msg})  {tag}", flush=True)
                continue
            if fn_code.co_freevars != fn.__code__.co_freevars:
                status, dt = "error(closure)", 0.0
            else:
                status, dt = run_tests(tests, fn, fn_code, limit)
            counts[status] = counts.get(status, 0) + 1
            print(f"  {status:9s} {dt:5.1f}s  {tag}", flush=True)
            records.append({"file": os.path.relpath(path, ROOT), "function": qualname, "tag": tag,
                            "status": status, "seconds": round(dt, 1)})
            if status != "killed":
                survivors.append((status, tag))
        save()
    if args.list:
        return
    save()
    print("\nscore per function (killed / total):")
    all_k = all_t = 0
    for key, c in totals.items():
        k, t = c.get("killed", 0) + c.get("killed by slow tests", 0), sum(c.values())
        all_k, all_t = all_k + k, all_t + t
        print(f"  {key}: {k}/{t} killed; " + ", ".join(f"{s} {n}" for s, n in sorted(c.items())))
    print(f"mutation score ({label}): {all_k}/{all_t} killed")
    print("not killed:")
    for status, tag in survivors:
        print(f"  {status}: {tag}")


if __name__ == "__main__":
    main()
