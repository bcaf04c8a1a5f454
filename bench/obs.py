"""Structured OBS pruning of a linear layer's input columns with closed-form compensation: SlimGPT's
``struct_prune`` (Batched Greedy Pruning), which EVAR-code copies verbatim, written as a function.

Shapes: W_OD is the weight of a linear layer y = W x (O outputs, D inputs; ``proj``: D = H·c,
``fc2``: D = F), H_DD ≈ E[x xᵀ] its input Hessian (``bench.calib``). A *unit* is ``headsize``
contiguous columns: a whole attention head (headsize = head dim c) or one FFN channel (headsize 1).

The algorithm (SlimGPT Sec. 3.2, EVAR Sec. 3 "Structured Unit Pruning and Closed-Form Compensation"):

1. Dead inputs (H_pp = 0) get H_pp = 1 and W_:,p = 0; then the damping λ = percdamp·mean(diag H) is
   added once to the diagonal (EVAR's "+ λI" that keeps H_pa positive definite).
2. Every iteration re-inverts the current H (Cholesky) and scores each column by the OBS error
   ‖W_:,p‖² / [H⁻¹]_pp (EVAR Eq. "score(u)", summed over the unit's columns). For heads the
   diagonal of H⁻¹ is replaced by the squared diagonal of the Cholesky factor of each head's c×c
   diagonal block of H⁻¹ (SlimGPT's grouped Cholesky: the error of removing the head's columns one
   after another). Already pruned columns score +∞.
3. Heads: the one head with the smallest summed score is removed per iteration. FFN channels:
   Dynamic Group Size: the first batch is (target − 512)//2 channels, then the batch size shrinks as
   b ← (b − 512)//2, each clamped to [64, 1024] and to what is left (``dgs_sizes``); a batch is the
   lowest-scoring columns in ascending score order.
4. Compensation (OBS: δW = −W_:,p [H⁻¹]_p,: / [H⁻¹]_pp, one column after another): permute the batch's
   columns to the front, take the upper Cholesky factor U of the permuted H⁻¹, run the sequential
   update inside the batch (Err_:,j = W_:,j / U_jj; W_:,j: −= Err_:,j U_j,j:, done here as the
   equivalent triangular solve Err = W_batch U_batch,batch⁻¹) and apply Err·U_batch,rest to all
   remaining columns at once (GPTQ's lazy batch update; exact sequential OBS).
5. The pruned columns are removed from H (rows/columns zero, diagonal 1) before the next iteration.
   ``compensate=False`` (SlimGPT's ``--no_compensate``) skips step 4 but still reduces H.

Counts follow the official code: round(units·sparsity) units are pruned with Python's round (half to
even), at least one unit kept (``bench.prune.n_keep``).

Deviation: float64 throughout (the official code works in float32); the choice can only differ on
near-ties.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from bench.models.var import AdaLNSelfAttn
from bench.prune import keep_channels, keep_heads, n_keep


def n_pruned(total: int, sparsity: float) -> int:
    """Units removed at ``sparsity``: round(total·sparsity), half to even, leaving at least one."""
    return total - n_keep(total, sparsity)


def dgs_sizes(target: int) -> List[int]:
    """SlimGPT's Dynamic Group Size: the FFN channel batches pruned per iteration (sum = target).
    VAR-d16 at 40% (1638 of 4096): [563] + [64]·16 + [51]."""
    sizes: List[int] = []
    block = (target - 512) // 2
    while sum(sizes) < target:
        sizes.append(min(target - sum(sizes), max(block, 64), 1024))
        block = (block - 512) // 2
    return sizes


def _cholesky(A: torch.Tensor, upper: bool = False) -> torch.Tensor:
    L, info = torch.linalg.cholesky_ex(A, upper=upper)
    if int(info.max() if info.dim() else info) != 0:
        raise ValueError("the Hessian is not positive definite: more calibration data or a larger percdamp is needed")
    return L


@torch.no_grad()
def struct_prune(W_OD: torch.Tensor, H_DD: torch.Tensor, n_units: int, headsize: int = 1, percdamp: float = 0.01,
                 compensate: bool = True, trace: Optional[list] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Prune ``n_units`` units of ``headsize`` input columns of W_OD.

    Returns (pruned column indices P (sorted, int64, P = n_units·headsize), W'_OD) where W' has the
    pruned columns zeroed and, with ``compensate``, the other columns updated; same dtype/device as
    W_OD. ``trace`` (a list) receives the number of columns pruned in each iteration."""
    O, D = W_OD.shape
    if D % headsize or H_DD.shape != (D, D):
        raise ValueError(f"W {tuple(W_OD.shape)}, H {tuple(H_DD.shape)} and headsize {headsize} do not fit")
    W = W_OD.detach().to(torch.float64, copy=True)
    H = H_DD.detach().to(W.device, torch.float64, copy=True)
    dead_D = H.diag() == 0
    H[dead_D, dead_D] = 1
    W[:, dead_D] = 0
    H.diagonal().add_(percdamp * H.diag().mean())
    pruned_D = torch.zeros(D, dtype=torch.bool, device=W.device)
    n_heads = D // headsize
    for cnt in [headsize] * n_units if headsize > 1 else dgs_sizes(n_units):
        # H⁻¹ via cholesky_solve: the same as cholesky_inverse, which is ~20× slower on CPU
        Hinv_DD = torch.cholesky_solve(torch.eye(D, dtype=H.dtype, device=H.device), _cholesky(H))
        if headsize > 1:   # grouped Cholesky: diagonal c×c blocks of H⁻¹, one per head
            blocks_Ncc = Hinv_DD.view(n_heads, headsize, n_heads, headsize).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
            d_D = _cholesky(blocks_Ncc).diagonal(dim1=-2, dim2=-1).reshape(-1) ** 2
        else:
            d_D = Hinv_DD.diag()
        err_D = (W ** 2 / d_D).sum(0)
        err_D[pruned_D] = torch.inf
        if headsize > 1:
            h = int(err_D.view(n_heads, headsize).sum(1).argmin())
            idx = torch.arange(h * headsize, (h + 1) * headsize, device=W.device)
        else:   # ascending score: the best-scoring column of the batch is removed first
            idx = err_D.topk(cnt, largest=False, sorted=True).indices
        if compensate:
            taken = torch.zeros(D, dtype=torch.bool, device=W.device)
            taken[idx] = True
            perm = torch.cat((idx, (~taken).nonzero().flatten()))
            U_cD = _cholesky(Hinv_DD[perm][:, perm], upper=True)[:cnt]   # rows of the batch's columns
            W_p = W[:, perm]
            # Sequential OBS inside the batch (for j: Err_:,j = W_:,j / U_jj; W_:,j: −= Err_:,j U_j,j:)
            # is forward substitution: W_batch = Err·U_batch,batch, solved in one triangular solve.
            Err_Oc = torch.linalg.solve_triangular(U_cD[:, :cnt], W_p[:, :cnt], upper=True, left=False)
            W_p[:, cnt:] -= Err_Oc @ U_cD[:, cnt:]    # the batch's error, spread over all other columns
            W[:, perm] = W_p
        W[:, idx] = 0
        H[idx, :] = 0
        H[:, idx] = 0
        H[idx, idx] = 1
        pruned_D[idx] = True
        if trace is not None:
            trace.append(cnt)
    return pruned_D.nonzero().flatten(), W.to(W_OD.dtype)


@torch.no_grad()
def prune_heads(block: AdaLNSelfAttn, H_DD: torch.Tensor, sparsity: float, percdamp: float = 0.01,
                compensate: bool = True) -> torch.Tensor:
    """Remove round(H·sparsity) heads of ``block`` chosen by ``struct_prune`` on ``attn.proj``
    (headsize = c), writing the compensated ``proj`` weight first; q/k/v rows are removed without
    compensation (as official). Returns the removed head indices (sorted)."""
    attn = block.attn
    k = n_pruned(attn.H, sparsity)
    if k == 0:
        return torch.zeros(0, dtype=torch.long)
    cols, W = struct_prune(attn.proj.weight, H_DD, k, attn.c, percdamp, compensate)
    attn.proj.weight.copy_(W)
    gone = torch.zeros(attn.H, dtype=torch.bool)
    gone[(cols // attn.c).cpu()] = True
    keep_heads(block, (~gone).nonzero().flatten().to(attn.proj.weight.device))
    return gone.nonzero().flatten()


@torch.no_grad()
def prune_channels(block: AdaLNSelfAttn, H_FF: torch.Tensor, sparsity: float, percdamp: float = 0.01,
                   compensate: bool = True) -> torch.Tensor:
    """Remove round(F·sparsity) FFN channels chosen by ``struct_prune`` on ``ffn.fc2`` (headsize 1),
    writing the compensated ``fc2`` weight first; ``fc1`` rows are removed without compensation.
    Returns the removed channel indices (sorted)."""
    fc2 = block.ffn.fc2
    k = n_pruned(fc2.in_features, sparsity)
    if k == 0:
        return torch.zeros(0, dtype=torch.long)
    cols, W = struct_prune(fc2.weight, H_FF, k, 1, percdamp, compensate)
    fc2.weight.copy_(W)
    gone = torch.zeros(fc2.in_features, dtype=torch.bool)
    gone[cols.cpu()] = True
    keep_channels(block, (~gone).nonzero().flatten().to(fc2.weight.device))
    return gone.nonzero().flatten()
