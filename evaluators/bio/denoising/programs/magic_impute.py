"""OpenProblems v1's "MAGIC (approximate, reversed normalisation)" through the magic-impute package, in the
candidates' form: square root of the counts, each cell divided by its total, MAGIC (knn 5, t 3, 100
principal components), then squared and multiplied back by the totals."""
import numpy as np
import magic


def magic_denoise(X, random_state=None, **kwargs):
    root = np.sqrt(X)
    libsize = root.sum(axis=1)
    libsize[libsize == 0] = 1.0
    op = magic.MAGIC(knn=5, t=3, n_pca=100, decay=1, solver="approximate", random_state=random_state, verbose=0)
    return np.square(op.fit_transform(root / libsize[:, None], genes="all_genes")) * libsize[:, None]
