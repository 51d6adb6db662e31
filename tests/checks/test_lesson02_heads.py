"""The lesson-02 checkers of the heads (course_lib/checks/lesson02_heads.py: split, merge, views) accept a
correct answer and name each deliberate mistake."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import passes
import torch

from course_lib.attention import merge_heads, split_heads
from course_lib.checks import check_merge_heads, check_split_heads, check_view_prediction, yours_or_reference
from course_lib.solutions import lesson02


# --------------------------------------------------------------------------- split_heads


def split_ok(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, num_heads, d_model // num_heads).transpose(1, 2)


def split_reshape_permute(x, num_heads):
    B, L, d_model = x.shape
    return x.reshape(B, L, num_heads, -1).permute(0, 2, 1, 3)


def split_unflatten(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).transpose(-3, -2)


def split_stacked_slices(x, num_heads):
    hd = x.size(-1) // num_heads
    return torch.stack([x[..., i * hd:(i + 1) * hd] for i in range(num_heads)], dim=1)


def split_no_transpose(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, num_heads, d_model // num_heads)


def split_straight(x, num_heads):
    B, L, d_model = x.shape
    return x.reshape(B, num_heads, L, d_model // num_heads)


def split_interleaved(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, d_model // num_heads, num_heads).permute(0, 3, 1, 2)


def split_wrong_head_dim(x, num_heads):
    B, L, d_model = x.shape
    return x.unsqueeze(1).expand(B, num_heads, L, d_model)  # every head gets all d_model features


def split_transpose_first(x, num_heads):
    B, L, d_model = x.shape
    return x.transpose(1, 2).reshape(B, num_heads, L, d_model // num_heads)


def split_sizes_swapped(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, d_model // num_heads, num_heads).transpose(1, 2)


def split_last_axes_transposed(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, num_heads, d_model // num_heads).transpose(-2, -1)


def split_hard_coded_heads(x, num_heads):
    B, L, d_model = x.shape
    return x.view(B, L, 3, d_model // 3).transpose(1, 2)


def split_calls_reference(x, num_heads):
    return split_heads(x, num_heads)


def split_calls_course_lib_method(x, num_heads):
    from course_lib import MultiHeadAttention

    return MultiHeadAttention(x.size(-1), num_heads).split_heads(x)


def split_todo(x, num_heads):
    raise NotImplementedError


@pytest.mark.parametrize(
    "fn", [split_ok, split_reshape_permute, split_unflatten, split_stacked_slices, lesson02.split_heads])
def test_split_heads_correct_passes(fn, capsys):
    assert passes(check_split_heads, fn)
    assert "check_split_heads: all 5 cases match" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (split_no_transpose, r"heads split without the transpose"),
        (split_straight, r"reshaped straight to \(B, num_heads, L, head_dim\).*section 5.*target_head_1"),
        (split_interleaved, r"every num_heads-th feature"),
        (split_wrong_head_dim, r"Wrong output shape.*head_dim = d_model // num_heads"),
        (split_transpose_first, r"transposed before splitting"),
        (split_sizes_swapped, r"num_heads and head_dim swapped in the view"),
        (split_last_axes_transposed, r"last two axes transposed \(transpose\(-2, -1\)\)"),
        (split_hard_coded_heads, r"\(x \(1, 4, 8\), num_heads=2\): sizes fixed in the code.*head_dim = d_model // num_heads = 4"),
        (split_heads, r"handed in course_lib's own `split_heads`.*show_solution"),
        (split_calls_reference, r"calls course_lib's `split_heads`"),
        (split_calls_course_lib_method, r"calls course_lib's `MultiHeadAttention.split_heads`"),
    ],
)
def test_split_heads_names_mistake(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_split_heads(fn)


def test_split_heads_unimplemented_is_friendly(capsys):
    assert check_split_heads(split_todo) is None
    assert "`split_todo` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- merge_heads


def merge_ok(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).reshape(B, L, h * hd)


def merge_contiguous_view(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).contiguous().view(B, L, h * hd)


def merge_permute_flatten(x):
    return x.permute(0, 2, 1, 3).flatten(2)


def merge_cat_heads(x):
    return torch.cat(x.unbind(1), dim=-1)  # Concat(head_1, ..., head_h), as in the paper


def merge_contiguous_view_no_transpose(x):  # the Debug exercise's bug
    B, h, L, hd = x.shape
    return x.contiguous().view(B, L, h * hd)


def merge_no_transpose(x):
    B, h, L, hd = x.shape
    return x.reshape(B, L, h * hd)


def merge_view_after_transpose(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).view(B, L, h * hd)


def merge_not_reshaped(x):
    return x.transpose(1, 2)


def merge_wrong_shape(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).reshape(B * L, h * hd)


def merge_last_axes_transposed(x):
    B, h, L, hd = x.shape
    return x.transpose(2, 3).reshape(B, L, h * hd)


def merge_interleaved(x):
    B, h, L, hd = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, L, h * hd)


def merge_cat_positions(x):
    return torch.cat(x.unbind(1), dim=1)


def merge_sum(x):
    return x.sum(dim=1)


def merge_mean(x):
    return x.mean(dim=1)


def merge_calls_reference(x):
    return merge_heads(x)


def merge_hard_coded(x):
    B, h, L, hd = x.shape
    return x.transpose(1, 2).reshape(B, L, 12)


def merge_todo(x):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [merge_ok, merge_contiguous_view, merge_permute_flatten, merge_cat_heads,
                                lesson02.merge_heads])
def test_merge_heads_correct_passes(fn, capsys):
    assert passes(check_merge_heads, fn)
    assert "check_merge_heads: all 4 cases match" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (merge_no_transpose, r"merged in the wrong order"),
        (merge_contiguous_view_no_transpose, r"merged in the wrong order.*silent"),
        (merge_view_after_transpose, r"`\.view` after `\.transpose`.*never copies.*\.reshape"),
        (merge_not_reshaped, r"transposed but not reshaped"),
        (merge_wrong_shape, r"Wrong output shape"),
        (merge_last_axes_transposed, r"last two axes transposed \(transpose\(2, 3\)\)"),
        (merge_interleaved, r"heads interleaved"),
        (merge_cat_positions, r"concatenated along the positions"),
        (merge_sum, r"heads added up instead of concatenated"),
        (merge_mean, r"heads averaged instead of concatenated"),
        (merge_heads, r"handed in course_lib's own `merge_heads`"),
        (merge_calls_reference, r"calls course_lib's `merge_heads`"),
        (merge_hard_coded, r"\(x \(1, 2, 4, 4\)\): sizes fixed in the code"),
    ],
)
def test_merge_heads_names_mistake(fn, words):
    with pytest.raises(AssertionError, match=words):
        check_merge_heads(fn)


def test_merge_heads_unimplemented_is_friendly(capsys):
    assert check_merge_heads(merge_todo) is None
    assert "`merge_todo` is not implemented yet" in capsys.readouterr().out


# --------------------------------------------------------------------------- yours_or_reference


def test_yours_or_reference_picks_the_learner_split_once_it_passed(capsys):
    def my_split(x, num_heads):
        return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)

    assert yours_or_reference(my_split, split_heads, "split_heads") is split_heads
    assert "using course_lib's `split_heads`" in capsys.readouterr().out
    check_split_heads(my_split)
    assert yours_or_reference(my_split, split_heads) is my_split
    # the names older notebooks imported from course_lib.checks (deprecated) are the library's functions
    from course_lib.checks import reference_merge_heads, reference_split_heads
    assert (reference_split_heads, reference_merge_heads) == (split_heads, merge_heads)


# --------------------------------------------------------------------------- predicted views


def view_todo():
    raise NotImplementedError


@pytest.mark.parametrize(
    "answer", [(False, True, False, True), ["raises", "works", "raises", "works"],
               (torch.tensor(False), np.bool_(True), "Raises", True)])
def test_view_prediction_right_passes(answer, capsys):
    fn = lambda: answer  # noqa: E731
    assert passes(check_view_prediction, fn)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "right, all four" in out


def test_view_prediction_solution_passes():
    assert passes(check_view_prediction, lesson02.predicted_view_works)


@pytest.mark.parametrize(
    "answer, words",
    [
        ((False, False, False, True), r"1 of 4 not right\. Likely confusion: view does not need a contiguous "
                                      r"tensor.*view\(1, 2, 2, 3, 2\) works: it only cuts L"),
        ((True, True, True, True), r"2 of 4.*view never copies, so it cannot glue.*view\(1, 4, 6\) raises.*"
                                   r"view\(1, 12, 2\) raises: it glues L"),
        ((False, True, True, True), r"1 of 4 not right\. swapped\.view\(1, 12, 2\) raises"),
        ((False, True, False, False), r"transposing back restores"),
        ((1, 0, 1, 0), r"Answer 1 should be True \(works\) or False \(raises\)"),
        ((True, False), r"Return 4 answers"),
    ],
)
def test_view_prediction_names_mistake(answer, words):
    with pytest.raises(AssertionError, match=words):
        check_view_prediction(lambda: answer)


def test_view_prediction_unimplemented_is_friendly(capsys):
    assert check_view_prediction(view_todo) is None
    assert "`view_todo` is not implemented yet" in capsys.readouterr().out
