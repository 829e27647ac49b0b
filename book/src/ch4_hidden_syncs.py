# %% [markdown]
# # Hidden host-device syncs
#
# This chapter is being written.

# %%
import experiments as ex

ex.status()
