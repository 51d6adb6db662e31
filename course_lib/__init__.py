"""course_lib: the finished reference code of the course "Transformers from Scratch".

Each module matches one lesson; read them in this order:
masks -> attention -> embeddings -> layers -> model -> data -> training -> decoding -> tasks
-> gpt -> lm_training -> tokenization -> modern -> rope -> llama, with pretrained (load real BERT
weights), viz (plots), checks (exercise checkers) and tracing (shape logging) alongside.
"""

from .attention import MultiHeadAttention, scaled_dot_product_attention, set_fused_attention
from .data import CopyTask, Vocab, pad_sequences
from .decoding import beam_search, greedy_decode, sample
from .embeddings import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    TransformerEmbedding,
    sinusoidal_positional_encoding,
)
from .layers import Decoder, DecoderLayer, Encoder, EncoderLayer, FeedForward
from .masks import causal_mask, decoder_self_attention_mask, padding_mask
from .model import (
    Transformer,
    TransformerClassifier,
    TransformerConfig,
    TransformerEncoderModel,
    count_parameters,
    init_xavier_,
)
from .tracing import disable_shape_tracing, enable_shape_tracing, shape_tracing
from .training import LabelSmoothingLoss, exact_match, noam_lr, noam_scheduler, train, train_copy_task

__version__ = "0.1.0"
