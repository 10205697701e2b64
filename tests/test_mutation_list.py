"""The mutation list of tests/mutation_score.py still fits the kernels: every snippet occurs exactly once.

The mutation run itself takes minutes and is not part of the test suite; this check is, so that an edit to a
kernel that moves or removes a mutated snippet fails here and the list is updated with it."""
import mutation_score


def test_every_snippet_occurs_exactly_once():
    assert mutation_score.problems() == []


def test_the_list_covers_every_kernel_file_and_class():
    files = {m.file for m in mutation_score.MUTATIONS}
    assert {"common.cuh", "conv.cu", "depthwise.cu", "implicit_gemm.cu", "mma.cuh", "patch.cu", "unfold.cu"} <= files
    kinds = {m.kind for m in mutation_score.MUTATIONS}
    assert {"removed barrier", "off-by-one", "swapped stride", "wrong-side padding", "half accumulation",
            "32-bit index", "misaligned pack"} <= kinds


def test_a_missing_snippet_is_reported(tmp_path):
    (tmp_path / "k.cu").write_text("int a = 1;\nint a = 1;\n")
    gone = mutation_score.Mutation("gone", "k.cu", "int b", "int c", "", "off-by-one")
    twice = mutation_score.Mutation("twice", "k.cu", "int a", "int c", "", "off-by-one")
    found = mutation_score.problems([gone, twice], tmp_path)
    assert [line.split(":")[0] for line in found] == ["gone", "twice"]
    assert "occurs 0 times" in found[0] and "occurs 2 times" in found[1]
