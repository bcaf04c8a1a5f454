"""Configs of the tiny world's models: the same VQVAE and VAR classes as the paper world, tiny sizes.

32×32 images, a 4× downsampling VQVAE (8×8 latent) and the 7-scale schedule 1,2,3,4,5,6,8
(155 tokens), 12 tinyshapes classes.
"""
from bench.models.configs import VARConfig, VQVAEConfig

PATCH_NUMS = (1, 2, 3, 4, 5, 6, 8)
IMAGE_SIZE = 32

TINY_VAE = VQVAEConfig(vocab_size=512, z_channels=16, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1,
                       using_sa=True, using_mid_sa=True, patch_nums=PATCH_NUMS, share_quant_resi=4)

TINY_VAR = VARConfig(depth=4, width=192, num_heads=6, mlp_ratio=4.0, num_classes=12,
                     vocab_size=TINY_VAE.vocab_size, Cvae=TINY_VAE.z_channels, patch_nums=PATCH_NUMS,
                     attn_l2_norm=True, cond_drop_rate=0.1, drop_path_rate=0.0)

# Default sampling of the tiny world (the paper world uses the official cfg 1.5 / top-k 900 / top-p 0.96):
# with a 512-entry codebook, top-k 900 would be a no-op.
TINY_SAMPLING = {"cfg": 2.0, "top_k": 50, "top_p": 0.9, "more_smooth": False}
