"""The paper's controlled softmax experiments (Section 2.4, Appendices G and H; Figures 1-5)."""
