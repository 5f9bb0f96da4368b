"""The documents of specdec_test_repeats: word-token prompts for the tests' tiny models."""

from datasets import Dataset, DatasetDict

PROMPTS = ["w5 w6 w7 w8 w5 w6", "w1 w2 w3", "w9 w9 w10 w11 w12", "w3 w4 w3 w4 w3", "w20 w21"]


def load(**kwargs) -> DatasetDict:
    return DatasetDict({"test": Dataset.from_dict({"prompt": PROMPTS})})


def score(doc, results) -> dict:
    return {"answered": float(bool(results[0]))}
