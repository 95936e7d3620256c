"""Model-based scorers for the evaluation suite: GenPPL from a local causal LM, BERTScore from a local encoder.

Import the submodules directly (``from dsl_llada.eval.scorers.genppl import CausalLMScorer``); importing this
package loads neither transformers nor bert-score.
"""
