"""The encoder-decoder is nn.Transformer(norm_first=True, batch_first=True) with a decoder that reads one memory for
several target sequences: the same state dict gives the same outputs, and G sequences per source give what each
sequence would with the memory repeated."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recsys.modules.encoder_decoder import EncoderDecoder

DIM, HEADS, FFN = 16, 4, 32


def pair() -> tuple[EncoderDecoder, nn.Transformer]:
    torch.manual_seed(0)
    reference = nn.Transformer(DIM, HEADS, 2, 2, FFN, dropout=0.1, batch_first=True, norm_first=True).eval()
    ours = EncoderDecoder(DIM, HEADS, 2, 2, FFN, dropout=0.1).eval()
    ours.load_state_dict(reference.state_dict())  # strict: every parameter name matches
    return ours, reference


def test_an_nn_transformer_state_dict_gives_the_same_memory_and_decoder_states() -> None:
    ours, reference = pair()
    source, target = torch.randn(3, 7, DIM), torch.randn(3, 4, DIM)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, :5], padding[1, :2] = True, True  # left padding, as histories are
    expected_memory = reference.encoder(source, src_key_padding_mask=padding)
    memory = ours.encode(source, padding)
    torch.testing.assert_close(memory[~padding], expected_memory[~padding], rtol=1e-5, atol=1e-5)
    causal = nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.bool)
    expected = reference.decoder(target, expected_memory, tgt_mask=causal, memory_key_padding_mask=padding)
    torch.testing.assert_close(ours.decode(target, memory, padding), expected, rtol=1e-5, atol=1e-5)


def test_several_sequences_per_source_read_it_as_if_it_were_repeated() -> None:
    ours, _ = pair()
    memory, padding = torch.randn(2, 5, DIM), torch.tensor([[True, False, False, False, False]] * 2)
    targets = torch.randn(2 * 3, 2, DIM)  # three sequences per source, a source's together
    grouped = ours.decode(targets, memory, padding)
    repeated = ours.decode(targets, memory.repeat_interleave(3, 0), padding.repeat_interleave(3, 0))
    torch.testing.assert_close(grouped, repeated, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="do not split evenly over 2 sources"):
        ours.decode(torch.randn(5, 2, DIM), memory, padding)
