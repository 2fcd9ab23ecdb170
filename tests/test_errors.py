"""visemz.errors: every error a VisemzError; checked_first_on_error's order of reports."""

import pytest

from visemz import errors
from visemz.errors import CorruptStreamError, InvalidArgumentError, checked_first_on_error


def test_every_error_type_is_a_visemz_error():
    kinds = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert len(kinds) >= 8 and all(issubclass(k, errors.VisemzError) for k in kinds)


def _fail(error):
    def check():
        raise error
    return check


def test_the_deferred_check_reports_first_when_the_block_fails():
    with pytest.raises(InvalidArgumentError, match="indexes"):
        with checked_first_on_error(_fail(InvalidArgumentError("indexes"))):
            raise CorruptStreamError("stream")


def test_the_block_error_stands_when_the_check_passes_or_the_error_is_not_listed():
    ran = []
    with pytest.raises(CorruptStreamError, match="stream"):
        with checked_first_on_error(lambda: ran.append(1)):
            raise CorruptStreamError("stream")
    assert ran == [1]
    with pytest.raises(KeyError):  # not among ``errors``: no check
        with checked_first_on_error(_fail(InvalidArgumentError("x")), (InvalidArgumentError,)):
            raise KeyError("k")


def test_the_check_does_not_run_when_the_block_succeeds():
    with checked_first_on_error(_fail(InvalidArgumentError("never"))):
        value = 1
    assert value == 1
