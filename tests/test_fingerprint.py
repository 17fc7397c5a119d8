import ast

from sglang_hotfix_trtllm.fingerprint import of_node


def fp(text):
    return of_node(ast.parse(text).body[0])


def test_formatting_comments_and_docstring_do_not_count():
    a = "def f(x):\n    '''doc'''\n    return x + 1\n"
    b = "def f(x):  # comment\n    return (x\n            + 1)\n"
    assert fp(a) == fp(b)


def test_any_change_to_the_code_changes_the_fingerprint():
    assert fp("def f(x):\n    return x + 1\n") != fp("def f(x):\n    return x + 2\n")
    assert fp("def f(x):\n    return x + 1\n") != fp("def f(y):\n    return y + 1\n")
