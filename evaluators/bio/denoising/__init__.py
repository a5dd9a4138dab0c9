"""Single-cell RNA denoising on real counts by OpenProblems v1's protocol (docs/method.md §5d).

counts.py (where the counts come from, the filters), split.py (the seeded binomial split),
metrics.py (MSE, Poisson, normalisation, validity, acceptance, reward), driver.py (what runs in
the sandbox), problem.py (the Problem), text.py (the model's problem text), programs/ (the MAGIC
seed and the ALRA baseline, in the candidates' form), report.py (the run report's section).
"""
