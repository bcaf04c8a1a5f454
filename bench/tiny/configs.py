"""Configs of the tiny world's models and data (torch-free: a leaf that every layer may read).

The same VQVAE and VAR classes as the paper world in tiny sizes: 32×32 images, a 4× downsampling
VQVAE (8×8 latent) and the 7-scale schedule 1,2,3,4,5,6,8 (155 tokens), 12 tinyshapes classes.
The tiny world's default sampling is ``bench.defaults.TINY_SAMPLING`` (the one defaults table).
"""
from bench.defaults import TINY_SAMPLING  # noqa: F401  (re-exported for the recipes)
from bench.models.configs import BSQConfig, InfinityConfig, TextConfig, VARConfig, VQVAEConfig

# tinyshapes' class vocabulary: class = shape × colour (``bench.data.tinyshapes`` draws them).
SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = {"red": (0.86, 0.16, 0.14), "green": (0.16, 0.72, 0.22), "blue": (0.16, 0.30, 0.88)}
CLASSES = tuple(f"{c} {s}" for s in SHAPES for c in COLOURS)
NUM_CLASSES = len(CLASSES)

PATCH_NUMS = (1, 2, 3, 4, 5, 6, 8)
IMAGE_SIZE = 32

TINY_VAE = VQVAEConfig(vocab_size=512, z_channels=16, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1,
                       using_sa=True, using_mid_sa=True, patch_nums=PATCH_NUMS, share_quant_resi=4)

TINY_VAR = VARConfig(depth=4, width=192, num_heads=6, mlp_ratio=4.0, num_classes=NUM_CLASSES,
                     vocab_size=TINY_VAE.vocab_size, Cvae=TINY_VAE.z_channels, patch_nums=PATCH_NUMS,
                     attn_l2_norm=True, cond_drop_rate=0.1, drop_path_rate=0.0)

# ---------------------------------------------------------------- tiny-t2i (the Infinity class, tiny)
# shapes-scenes (``bench.data.scenes``): 64×64 scenes of 1–4 objects described by a prompt grammar
# over this word vocabulary (index 0 = padding).
T2I_SHAPE_PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}
T2I_NUMBERS = ("one", "two", "three", "four")
T2I_VOCAB = ("<pad>", "a", "and", "of", "left", "right", "above", "below", *T2I_NUMBERS, *COLOURS,
             *SHAPES, *(T2I_SHAPE_PLURALS[s] for s in SHAPES))
# the shapes-scenes grammar's task types (GenEval's six), in order: scene i of a split has task i mod 6
SCENE_TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
T2I_MAX_WORDS = 8                      # "a red circle left of a blue square"
T2I_IMAGE_SIZE = 64
T2I_SCHEDULE = ((1, 1), (2, 2), (4, 4), (6, 6), (8, 8))   # Infinity's 1:1 schedule up to 8×8: 121 tokens

TINY_BSQ = BSQConfig(codebook_dim=16, base_ch=24, ch_mult=(1, 2, 2, 2), num_res_blocks=1, patch_size=8)
TINY_TEXT = TextConfig(vocab=T2I_VOCAB, max_len=T2I_MAX_WORDS, width=128, depth=2, heads=4, out_channels=128, conv_kernel=3)
TINY_T2I = InfinityConfig(depth=4, width=192, num_heads=6, mlp_ratio=4.0, text_channels=TINY_TEXT.out_channels,
                          text_maxlen=T2I_MAX_WORDS, codebook_dim=TINY_BSQ.codebook_dim, block_chunks=1,
                          scale_schedule=T2I_SCHEDULE, rope_grid=T2I_SCHEDULE[-1], cond_drop_rate=0.1,
                          drop_path_rate=0.0, ca_bf16=False, vae_stride=TINY_BSQ.patch_size)
