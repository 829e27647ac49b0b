# %% [markdown]
# # Pinned memory
#
# This chapter is being written.

# %%
import experiments as ex

ex.status()
