"""The fault matrix, round 2: the allow-lists are sound against name-based and
descriptor routes. Each variant below reaches an attribute a record relies on
by a route other than the plain ``self.name`` the record examines, or changes
a helper the repair relies on without touching the attributes: each must be
``unknown`` (each was called ``affected`` by 0.3.0). Variants are made from
SGLang 0.5.12's own file by replacing one line of it, so they hold only
while that line is there (asserted).
"""

import pytest

import release_selection
import swa_cases
from sglang_hotfix_trtllm import detect
from sglang_hotfix_trtllm.records import pr25103, pr26521
from sglang_hotfix_trtllm.record import Verdict

CLASS_LINE = "class TRTLLMHAAttnBackend(FlashInferAttnBackend):\n"
CLASS_DOC = '    """TRTLLM MHA attention kernel from flashinfer."""\n'
HELPER_DOC = '        """Allocate a SWA page_table buffer, or return None for non-SWA models."""\n'
LOGGER = "\nlogger = "


def _in_a_method(statement):
    """``statement`` in a new method of the class (none of the helpers the records know)."""
    return CLASS_DOC, CLASS_DOC + "\n    def _restore(self, state, name):\n        " + statement + "\n"


def _in_the_class_body(statement):
    return CLASS_DOC, CLASS_DOC + "\n    " + statement + "\n"


def _at_module_level(statement):
    return LOGGER, "\n" + statement + LOGGER


# name -> (record, (text in 0.5.12's file, what replaces it))
VARIANTS = {
    # pr25103: its attributes by name, by the attribute protocol, by descriptors, at class or module level.
    "pr25103_setattr_by_constant_name": (pr25103, _in_a_method("setattr(self, '_swa_kv_pool', None)")),
    "pr25103_getattr_by_constant_name": (pr25103, _in_a_method("getattr(self, 'use_sliding_window_kv_pool')")),
    "pr25103_dict_item_by_name": (pr25103, _in_a_method("self.__dict__['_swa_kv_pool'] = None")),
    "pr25103_object_setattr": (pr25103, _in_a_method("object.__setattr__(self, name, None)")),
    "pr25103_vars_update": (pr25103, _in_a_method("vars(self).update(state)")),
    "pr25103_setattr_by_computed_name": (pr25103, _in_a_method("setattr(self, '_swa' + '_kv_pool', None)")),
    "pr25103_property_in_class_body": (
        pr25103,
        _in_the_class_body("use_sliding_window_kv_pool = property(lambda self: True, lambda self, value: None)"),
    ),
    "pr25103_property_def_in_class_body": (
        pr25103,
        _in_the_class_body("@property\n    def _swa_kv_pool(self):\n        return None"),
    ),
    "pr25103_lambda_in_class_body": (pr25103, _in_the_class_body("peek = lambda self: self._swa_kv_pool")),
    "pr25103_descriptor_stored_on_the_class": (
        pr25103,
        (
            "\nclass TRTLLMHAAttnMultiStepDraftBackend",
            "\nTRTLLMHAAttnBackend.use_sliding_window_kv_pool = property("
            "lambda self: True)\n\nclass TRTLLMHAAttnMultiStepDraftBackend",
        ),
    ),
    "pr25103_global_rebinding_of_the_pool_class": (pr25103, _in_a_method("global SWAKVPool")),
    "pr25103_helper_lost_its_flag_test": (
        pr25103,
        (HELPER_DOC + "        if not self.use_sliding_window_kv_pool:\n            return None\n", HELPER_DOC),
    ),
    "pr25103_getattr_protocol_defined": (
        pr25103,
        _in_the_class_body("def __getattr__(self, name):\n        return None"),
    ),
    # pr26521: the buffer table, the step id and the metadata field.
    "pr26521_buffer_table_as_a_property": (
        pr26521,
        _in_the_class_body("decode_cuda_graph_metadata = property(lambda self: {})"),
    ),
    "pr26521_step_id_set_by_name": (pr26521, _in_a_method("setattr(self, 'speculative_step_id', 0)")),
    "pr26521_metadata_field_as_a_property": (
        pr26521,
        _at_module_level("TRTLLMMHAMetadata.cache_seqlens_int32 = property(lambda self: None)"),
    ),
    "pr26521_metadata_setattr_protocol": (
        pr26521,
        (
            "    swa_page_table: torch.Tensor = None\n",
            "    swa_page_table: torch.Tensor = None\n\n"
            "    def __setattr__(self, name, value):\n"
            "        object.__setattr__(self, name, value)\n",
        ),
    ),
}


@pytest.fixture(scope="module")
def source():
    return (release_selection.release_dir("0.5.12") / swa_cases.BACKEND).read_text(encoding="utf-8")


def _verdict(record, text):
    return detect.assess_source(record.HOTFIX, "trtllm_mha_backend.py", text=text)


def test_the_unchanged_file_is_affected_for_both_records(source):
    for record in (pr26521, pr25103):
        assert _verdict(record, source).verdict is Verdict.AFFECTED


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_route_around_the_examined_attributes_is_unknown(variant, source):
    record, (old, new) = VARIANTS[variant]
    assert source.count(old) == 1, variant
    assessment = _verdict(record, source.replace(old, new))
    assert assessment.verdict is Verdict.UNKNOWN, assessment.reason


def test_upstreams_statement_overwritten_later_in_init_is_not_fixed():
    """0.5.13's resolution followed by a write from the allocator: not what 0.5.13 does."""
    text = (release_selection.release_dir("0.5.13") / swa_cases.BACKEND).read_text(encoding="utf-8")
    assert _verdict(pr25103, text).verdict is Verdict.FIXED
    statement = "        self._swa_kv_pool: Optional[SWAKVPool] = self._resolve_swa_kv_pool(model_runner)\n"
    assert text.count(statement) == 1
    overwritten = text.replace(
        statement, statement + "        self._swa_kv_pool = model_runner.token_to_kv_pool_allocator.get_kvcache()\n"
    )
    assessment = _verdict(pr25103, overwritten)
    assert assessment.verdict is Verdict.UNKNOWN, assessment.reason
