# %% [markdown]
# # The caching allocator and fragmentation
#
# This chapter is being written.

# %%
import experiments as ex

ex.status()
