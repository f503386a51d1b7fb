// Anchor for the precompiled LibTorch header shared by every target.
