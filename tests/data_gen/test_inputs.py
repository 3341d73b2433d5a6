"""Inputs: every error names file, line or field and the fix; folders are chunked with overlap (txt, md, pdf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from selfrag.corpus import load_chunks, load_corpus, load_queries
from selfrag.errors import InputError


def test_non_utf8_bytes_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(
        InputError, match=rf"{path}:2: byte 0xe9 at column 25 is not UTF-8; save the corpus file as UTF-8"
    ):
        load_corpus(path)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"fine\nstill fine\n\xff\n")
    with pytest.raises(InputError, match=r"a.txt:3: byte 0xff"):
        load_corpus(folder)


def test_queries_take_answer_output_and_default_ids(tmp_path: Path) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"question": "A?", "answer": "a"}\n\n{"question": "B?", "output": "Long. Answer."}\n')
    first, second = load_queries(queries)
    assert (first.id, first.answers, first.output) == ("q-1", ("a",), None)
    assert (second.id, second.answers, second.output) == ("q-3", (), "Long. Answer.")


def test_folder_chunks_overlap_and_keep_source_and_position(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "long.txt").write_text(" ".join(f"w{i}" for i in range(25)))
    (folder / "sub" / "short.md").write_text("# Title\nbody text\n")
    chunks = load_chunks(folder, chunk_words=10, chunk_overlap=3)
    long = [chunk for chunk in chunks if chunk.source == "long.txt"]
    assert [(c.passage.id, c.start, c.end) for c in long] == [
        ("long.txt#0", 0, 10),
        ("long.txt#1", 7, 17),
        ("long.txt#2", 14, 24),
        ("long.txt#3", 21, 25),
    ]
    assert long[1].passage.text.split()[:3] == long[0].passage.text.split()[-3:]  # the overlap
    (short,) = [chunk for chunk in chunks if chunk.source != "long.txt"]
    assert (short.passage.id, short.passage.title, short.passage.text) == ("sub/short.md", "Title", "body text")
    assert short.to_json()["source"] == "sub/short.md"
    with pytest.raises(InputError, match="chunk_overlap must be in"):
        load_chunks(folder, chunk_words=5, chunk_overlap=5)
    (folder / "empty.txt").write_text("   \n")
    with pytest.raises(InputError, match=r"empty.txt: no text in this file"):
        load_chunks(folder)


def _pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF with one line of Helvetica text per page (offsets computed, so pypdf reads it)."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", ""]
    kids = []
    for text in pages:
        page_number = len(objects) + 1
        kids.append(f"{page_number} 0 R")
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {page_number + 1} 0 R "
            "/Resources << /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >> >>"
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(pages)} >>"
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def test_pdf_pages_are_read_and_chunks_know_their_page(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "report.pdf").write_bytes(_pdf(["alpha beta gamma delta", "epsilon zeta eta theta"]))
    chunks = load_chunks(folder, chunk_words=4, chunk_overlap=0)
    assert {c.passage.title for c in chunks} == {"report"}  # no /Title in its metadata: the file name
    assert [(c.passage.id, c.passage.text, c.page) for c in chunks] == [
        ("report.pdf#0", "alpha beta gamma delta", 1),
        ("report.pdf#1", "epsilon zeta eta theta", 2),
    ]
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    with pytest.raises(InputError, match=r"broken.pdf: not a readable PDF"):
        load_chunks(folder)


def test_markdown_headings_are_titles_not_text(tmp_path: Path) -> None:
    """A Markdown file's headings leave the passage text; the first is the title, and a chunk that starts under a
    later heading is titled "<first> — <that heading>" (the file name was the title, the '#' lines were text)."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "quill_lang.md").write_text(
        "---\nauthor: me\n---\n# Quill language\n\nQuill is a small language.\n\n## Blocks ##\n"
        "Blocks are marked by indent and end at a blank line here.\n"
    )
    chunks = load_chunks(folder, chunk_words=5, chunk_overlap=0)
    assert [(c.passage.title, c.passage.text) for c in chunks] == [
        ("Quill language", "Quill is a small language."),
        ("Quill language — Blocks", "Blocks are marked by indent"),
        ("Quill language — Blocks", "and end at a blank"),
        ("Quill language — Blocks", "line here."),
    ]
    assert not any("#" in c.passage.text or "author" in c.passage.text for c in chunks)


def test_text_file_titles(tmp_path: Path) -> None:
    """A .txt file's first line is its title when it reads as one (it stays in the text); else the file name, with
    '_' and '-' read as spaces."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("Harbour tides of Velm\n\nThe tide turns twice a day.\n")
    (folder / "b_notes-2.txt").write_text("The tide turns twice a day.\nIt is late.\n")
    titled, named = load_chunks(folder)
    assert (titled.passage.title, titled.passage.text) == ("Harbour tides of Velm",
                                                           "Harbour tides of Velm The tide turns twice a day.")
    assert named.passage.title == "b notes 2"
