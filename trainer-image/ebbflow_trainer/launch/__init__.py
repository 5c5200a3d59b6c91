"""The trainer's processes and worlds: the elastic agent and launcher, the rendezvous store and handler,
the warm forkserver, one world's training loop (`worker`) and the state that survives a rescale.
"""
