"""The paper's critic instructions and few-shot demonstrations, one set per decision the LLM labeler asks.

Read from AkariAsai/self-rag (commit 1fcdc42), data_creation/critic/gpt4_reward/:

    retrieve           chatgpt_need_retrieval.py  PROMPT_DICT["context"]                    (7 demonstrations)
    retrieve_sentence  chatgpt_need_retrieval.py  PROMPT_DICT["multi_retrieval_three_way"]  (1)
    relevance          chatgpt_relevance.py       PROMPT_DICT["multi"]                      (2)
    support            chatgpt_groundness.py      PROMPT_DICT["multi"]  (the three-way scale) (1)
    utility            chatgpt_utility.py         PROMPT_DICT["context"]                    (2)

The definitions, scales and demonstrations are the paper's words, with only these changes: the decisions are
named with our reflection tokens (the retrieve prompt's ``[Yes]`` / ``[No]`` are ``[Retrieval]`` /
``[No Retrieval]``; a perceived utility of k is ``[Utility:k]``); each demonstration's answer is written as the
strict JSON reply :mod:`selfrag.data_gen.labelers` asks for (its explanation is the paper's); a missing line
break, a missing list dash and a stray quote of the originals are fixed. The fields of each item come in the
paper's order (support: output before evidence).
"""

from __future__ import annotations

from dataclasses import dataclass

from selfrag import reflection as rf


@dataclass(frozen=True)
class Demonstration:
    """One worked example: the item's fields and the answer (label + the paper's explanation)."""

    question: str
    label: str
    explanation: str
    evidence: str | None = None  # the passage as rendered (title, newline, text)
    output: str | None = None
    preceding: str = ""


INSTRUCTIONS: dict[str, str] = {
    "retrieve": (
        "Given an instruction, please make a judgment on whether finding some external documents from the web "
        "(e.g., Wikipedia) helps to generate a better response. Please answer [Retrieval] or [No Retrieval] and "
        "write an explanation."
    ),
    "retrieve_sentence": (
        "You will be provided with an instruction, evidence, output sentence, and preceding sentences (optional). "
        "If the preceding sentence is given, the output should be the sentence that follows those preceding "
        "sentences. Your task is to determine whether the information in the output sentence can be fully "
        "verified by the evidence or if it requires further external verification. There are three cases:\n"
        "- If the output sentence can be verified solely with the evidence, then respond with "
        "[Continue to Use Evidence].\n"
        "- If the sentence doesn't require any factual verification (e.g., a subjective sentence or a sentence "
        "about common sense), then respond with [No Retrieval].\n"
        "- If additional information is needed to verify the output sentence, respond with [Retrieval]. "
        "Please provide explanations for your judgments."
    ),
    "relevance": (
        "You'll be provided with an instruction, along with evidence and possibly some preceding sentences. "
        "When there are preceding sentences, your focus should be on the sentence that comes after them. "
        "Your job is to determine if the evidence is relevant to the initial instruction and the preceding "
        "context, and provides useful information to complete the task described in the instruction. "
        "If the evidence meets this requirement, respond with [Relevant]; otherwise, generate [Irrelevant]."
    ),
    "support": (
        "You will receive an instruction, evidence, and output, and optional preceding sentences. If the "
        "preceding sentence is given, the output should be the sentence that follows those preceding sentences. "
        "Your task is to evaluate if the output is fully supported by the information provided in the evidence, "
        "and provide explanations on your judgement.\n"
        "Use the following entailment scale to generate a score:\n"
        "[Fully supported] - All information in output is supported by the evidence, or extractions from the "
        "evidence. This is only applicable when the output and part of the evidence are almost identical.\n"
        "[Partially supported] - The output is supported by the evidence to some extent, but there is major "
        "information in the output that is not discussed in the evidence. For example, if an instruction asks "
        "about two concepts and the evidence only discusses either of them, it should be considered a "
        "[Partially supported].\n"
        "[No support / Contradictory] - The output completely ignores evidence, is unrelated to the evidence, or "
        "contradicts the evidence. This can also happen if the evidence is irrelevant to the instruction.\n\n"
        "Make sure to not use any external information/knowledge to judge whether the output is true or not. "
        "Only check whether the output is supported by the evidence, and not whether the output follows the "
        "instructions or not."
    ),
    "utility": (
        "Given an instruction and an output, rate whether the response appears to be a helpful and informative "
        "answer to the query, from 1 (lowest) - 5 (highest). We call this score perceived utility. "
        "Answer a score of k as [Utility:k].\n\n"
        "The detailed criterion is as follows:\n"
        "5: The response provides a complete, highly detailed, and informative response to the query, fully "
        "satisfying the information needs.\n"
        "4: The response mostly fulfills the need in the query, while there can be some minor improvements such "
        "as discussing more detailed information, having better structure of the response, or improving "
        "coherence.\n"
        "3: The response is acceptable, but some major additions or improvements are needed to satisfy users' "
        "needs.\n"
        "2: The response still addresses the main request, but it is not complete or not relevant to the query.\n"
        "1: The response is barely on-topic or completely irrelevant."
    ),
}

_EMBEDDINGS_QUESTION = "Explain the use of word embeddings in Natural Language Processing."
_EMBEDDINGS_PRECEDING = (
    "Word embeddings are one of the most powerful tools available for Natural Language Processing (NLP). They are "
    "mathematical representations of words or phrases in a vector space, allowing similarities between words and "
    "the context in which they are used to be measured."
)
_EMBEDDINGS_OUTPUT = (
    "Word embeddings are useful for tasks such as sentiment analysis, text classification, predicting the next word "
    "in a sequence, and understanding synonyms and analogies."
)
_EMBEDDINGS_DEFINITION = (
    "Word embedding\nWord embedding is the collective name for a set of language modeling and feature learning "
    "techniques in natural language processing (NLP) where words or phrases from the vocabulary are mapped to "
    "vectors of real numbers."
)

DEMONSTRATIONS: dict[str, tuple[Demonstration, ...]] = {
    "retrieve": (
        Demonstration(
            "Give three tips for staying healthy.",
            rf.RETRIEVAL,
            "There might be some online sources listing three tips for staying healthy or some reliable sources to "
            "explain the effects of different behaviors on health. So retrieving documents is helpful to improve "
            "the response to this query.",
        ),
        Demonstration(
            "Describe a time when you had to make a difficult decision.",
            rf.NO_RETRIEVAL,
            "This instruction is asking about some personal experience and thus it does not require one to find "
            "some external documents.",
        ),
        Demonstration(
            "Write a short story in third person narration about a protagonist who has to make an important career "
            "decision.",
            rf.NO_RETRIEVAL,
            "This instruction asks us to write a short story, which does not require external evidence to verify.",
        ),
        Demonstration(
            "What is the capital of France?",
            rf.RETRIEVAL,
            "While the instruction simply asks us to answer the capital of France, which is a widely known fact, "
            "retrieving web documents for this question can still help.",
        ),
        Demonstration(
            "Find the area of a circle given its radius. Radius = 4",
            rf.NO_RETRIEVAL,
            "This is a math question and although we may be able to find some documents describing a formula, it "
            "is unlikely to find a document exactly mentioning the answer.",
        ),
        Demonstration(
            "Arrange the words in the given sentence to form a grammatically correct sentence. quickly the brown fox "
            "jumped",
            rf.NO_RETRIEVAL,
            "This task doesn't require any external evidence, as it is a simple grammatical question.",
        ),
        Demonstration(
            "Explain the process of cellular respiration in plants.",
            rf.RETRIEVAL,
            "This instruction asks for a detailed description of a scientific concept, and is highly likely that we "
            "can find a reliable and useful document to support the response.",
        ),
    ),
    "retrieve_sentence": (
        Demonstration(
            _EMBEDDINGS_QUESTION,
            rf.RETRIEVAL,
            "The output discusses the applications of word embeddings, while the evidence only discusses the "
            "definitions of word embeddings and how it works. Therefore, we need to retrieve other evidence to "
            "verify whether the output is correct or not.",
            evidence=_EMBEDDINGS_DEFINITION
            + " Conceptually it involves a mathematical embedding from a space with one dimension per word to a "
            "continuous vector space with a much lower dimension.",
            output=_EMBEDDINGS_OUTPUT,
            preceding=_EMBEDDINGS_PRECEDING,
        ),
    ),
    "relevance": (
        Demonstration(
            "Given four answer options, A, B, C, and D, choose the best answer.\n"
            "Input: Earth rotating causes\n"
            "A: the cycling of AM and PM\nB: the creation of volcanic eruptions\nC: the cycling of the tides\n"
            "D: the creation of gravity",
            rf.RELEVANT,
            "The evidence explicitly mentions that the rotation causes a day-night cycle, as described in the answer "
            "option A.",
            evidence="Rotation causes the day-night cycle which also creates a corresponding cycle of temperature "
            "and humidity creates a corresponding cycle of temperature and humidity. Sea level rises and falls "
            "twice a day as the earth rotates.",
        ),
        Demonstration(
            "age to run for us house of representatives",
            rf.IRRELEVANT,
            "The evidence only discusses the ages to run for the US Senate, not for the House of Representatives.",
            evidence="The Constitution sets three qualifications for service in the U.S. Senate: age (at least "
            "thirty years of age); U.S. citizenship (at least nine years); and residency in the state a senator "
            "represents at the time of election.",
        ),
    ),
    "support": (
        Demonstration(
            _EMBEDDINGS_QUESTION,
            rf.FULLY_SUPPORTED,
            "The output sentence discusses the application of word embeddings, and the evidence mentions all of "
            "the applications syntactic parsing, sentiment analysis, next token predictions as well as analogy "
            "detection as the applications. Therefore, the score should be [Fully supported].",
            evidence=_EMBEDDINGS_DEFINITION
            + " Word and phrase embeddings, when used as the underlying input representation, have been shown to "
            "boost the performance in NLP tasks such as syntactic parsing, sentiment analysis, next token "
            "predictions as well as analogy detection.",
            output=_EMBEDDINGS_OUTPUT,
            preceding=_EMBEDDINGS_PRECEDING,
        ),
    ),
    "utility": (
        Demonstration(
            "Who is the current prime minister of the UK as of 2023?",
            rf.UTILITY_TOKENS[1],
            "While the output provides a factually correct statement about the UK prime minister from 2019 to "
            "2022, this instruction asks who the prime minister is as of 2023, so it doesn't answer the "
            "instruction. Therefore, the utility is 2.",
            output="Boris Johnson was the prime minister of the UK from 2019 - 2022.",
        ),
        Demonstration(
            "Given a description of a travel destination, recommend 10 tourist attractions with detailed "
            "explanations of each. The travel destination is Tokyo, Japan.",
            rf.UTILITY_TOKENS[2],
            "This output doesn't provide descriptions of each attraction and the number of the attractions is also "
            "less than 10. While this output partially answers the instructions, it doesn't match the instructions "
            "strictly.",
            output="Tokyo is a vibrant city full of exciting tourist attractions. Some must-see sights include the "
            "Tokyo Skytree, Tokyo Disneyland, Sensoji Temple, Meiji Shrine, Tsukiji Fish Market, Harajuku, and "
            "Shinjuku Gyoen.",
        ),
    ),
}
