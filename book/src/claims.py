# %% [markdown]
# # All claims, checked
#
# Every chapter states the claims of its DevLog post that can be measured, names the
# experiment that measures each, and the predicate that decides whether it holds. This
# page evaluates all of them with the same code as `python -m experiments claims`
# (live on a GPU, or from the recorded lab results without one).

# %%
import experiments as ex

ex.status()

# %%
ex.claims_table()
