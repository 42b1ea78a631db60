"""Offline training text, on any machine without a network: the standard library's source (code and
docstrings), ``pydoc_data`` (the language reference and library docs as prose), the installed
distributions' descriptions; and the prompts the target answers to make its own text. The manifest
lists every item used, so a run says exactly what it trained on."""
import ast
import importlib.metadata
import os
import random
import sysconfig

_SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages", "ensurepip",
              "lib2to3", "turtledemo", "config-3.11-x86_64-linux-gnu"}


def stdlib_sources(limit=None):
    """(relpath, text) of the standard library's .py files, sorted, tests excluded."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            if len(text) > 200:
                out.append(("stdlib/" + os.path.relpath(path, root), text))
                if limit and len(out) >= limit:
                    return out
    return out


def pydoc_topics():
    """(name, text) of the documentation topics that ship in ``pydoc_data`` (plain English prose)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [(f"pydoc_data/{k}", v) for k, v in sorted(topics.items()) if len(v) > 200]


def package_docs():
    """(name, text) of installed distributions' long descriptions (README text)."""
    out, seen = [], set()
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = dist.metadata["Name"]
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        body = dist.metadata.get_payload() if hasattr(dist.metadata, "get_payload") else None
        body = body or dist.metadata.get("Description") or ""
        if len(body) > 500:
            out.append((f"dist/{name}/METADATA", body))
    return out


def _parsed(sources):
    """(rel, module AST) of every source that parses."""
    for rel, text in sources:
        try:
            yield rel, ast.parse(text)
        except SyntaxError:
            continue


def docstrings(sources):
    """(name, text) of module/class/function docstrings of at least 3 lines from ``sources``."""
    out = []
    for rel, tree in _parsed(sources):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc.count("\n") >= 2:
                    out.append((f"{rel}:{getattr(node, 'name', '<module>')}", doc))
    return out


def functions_with_summaries(sources):
    """(qualified name, signature line, one-line summary) of documented public stdlib functions."""
    out = []
    for rel, tree in _parsed(sources):
        mod = rel[len("stdlib/"):-3].replace("/", ".").replace(".__init__", "")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                first = (ast.get_docstring(node) or "").strip().split("\n")[0].strip()
                if 20 <= len(first) <= 160:
                    out.append((f"{mod}.{node.name}", ast.unparse(node.args), first))
    return out


# ---- prompts the target answers (its own text is the distribution the draft must match) ---------

_TOPICS = ["the ocean", "a lighthouse keeper", "winter mornings", "a lost key", "the first day of school",
           "a robot learning to paint", "an old library", "mountain villages", "a thunderstorm",
           "friendship", "a city at night", "the history of bread", "a long train journey", "bees",
           "a garden in spring", "the moon landing", "a forgotten letter", "rivers", "a small bakery",
           "volcanoes", "the invention of the printing press", "a desert crossing", "honesty",
           "a chess tournament", "a cat who travels", "rain forests", "a music teacher", "time zones"]
_CONCEPTS = ["photosynthesis", "inflation", "gravity", "machine learning", "the water cycle", "democracy",
             "recursion", "vaccines", "black holes", "compound interest", "climate change", "DNA",
             "electricity", "the stock market", "evolution", "encryption", "supply and demand",
             "the immune system", "plate tectonics", "renewable energy", "the internet", "sleep",
             "nutrition", "probability", "the scientific method", "memory in the brain"]
_TASKS = ["learn a new language", "prepare for a job interview", "start running", "save money",
          "write a good email", "improve my sleep", "cook rice", "organize my week", "study for exams",
          "make new friends", "reduce stress", "plan a trip", "keep houseplants alive", "give a talk",
          "start a small business", "learn to play guitar", "be more productive", "write a resume"]
_NAMES = ["Alice", "Bob", "Maria", "Tom", "Sara", "Ken", "Lena", "Omar", "Priya", "Jack"]
_ITEMS = ["apples", "books", "pencils", "marbles", "cookies", "stickers", "cards", "oranges", "coins"]


def _math_prompt(rng):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    n1, n2 = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    return rng.choice([
        f"What is {a} times {b}?",
        f"Calculate {a} + {b} * {c}.",
        f"Solve for x: {c}x + {a} = {a + c * b}.",
        f"What is {c * 5}% of {a * 10}?",
        f"{n1} has {a} {item} and gives {min(a, b)} to {n2}. How many {item} does {n1} have left?",
        f"A train travels {a * 10} km in {c} hours. What is its average speed?",
        f"{n1} buys {c} packs of {item} with {b} in each pack. How many {item} in total? Explain step by step.",
        f"Is {a * b + 1} a prime number? Explain.",
        f"Simplify the fraction {a * c}/{b * c}.",
        f"What is the area of a rectangle with sides {a} cm and {b} cm?",
        f"Find the derivative of {c}x^2 + {a}x + {b}.",
        f"If a shirt costs ${a} and is discounted by {c * 5}%, what is the new price?",
    ])


_LANGS = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch"]
_SUBJECTS = ["The museum", "My neighbour", "The new teacher", "Our train", "The bakery on the corner",
             "The city council", "My brother", "The hotel", "The football club", "This small village"]
_PREDICATES = ["opens at eight in the morning and closes late on Fridays",
               "has asked everyone to bring a warm coat for the trip",
               "was built more than two hundred years ago",
               "will be late tomorrow because of the snow",
               "sells fresh bread and cakes every day except Sunday",
               "is looking for volunteers to help with the summer festival",
               "moved to a larger building near the river last year",
               "offers free guided tours in several languages",
               "needs to repair the roof before the winter starts",
               "won the regional prize for the third time in a row"]
_FACT_QS = ["What is {c}?", "How does {c} work?", "Why does {c} matter for everyday life?",
            "What are the main causes of {c}?", "Who first described {c}, and when?",
            "What is a common misconception about {c}?", "Give a short definition of {c}."]


def _prompt(cat, rng, funcs, paragraphs, code_snips):
    """One prompt of category ``cat`` -> (chat, text); ``chat`` False: text to continue."""
    form = rng.random()
    chat = True  # wrapped in the chat template, unless the prompt is text to continue
    if cat == "code":
        if funcs and form < 0.45:
            name, args, summary = rng.choice(funcs)
            text = f"Write a Python function `{name.split('.')[-1]}({args})` that does the following: {summary}"
        elif code_snips and form < 0.75:
            snip = rng.choice(code_snips)
            verb = rng.choice(["Explain what this Python code does", "Add comments to this code",
                               "Rewrite this code to be clearer", "Find possible bugs in this code"])
            text = f"{verb}:\n```python\n{snip}\n```"
        elif code_snips and form < 0.9:
            chat, text = False, rng.choice(code_snips) + "\n"
        else:
            task = rng.choice(["reverses a string", "checks if a number is prime", "sorts a list of dicts by a key",
                               "reads a CSV file and sums a column", "computes Fibonacci numbers",
                               "counts word frequencies in a text", "merges two sorted lists",
                               "validates an email address", "finds the largest element in a list"])
            lang = rng.choice(["Python", "Python", "JavaScript", "C", "Java"])
            text = f"Write a {lang} function that {task}."
    elif cat == "prose":
        if paragraphs and form < 0.35:
            para = rng.choice(paragraphs)
            verb = rng.choice(["Summarize the following text", "Explain this in simple words",
                               "Rewrite this paragraph in plain English"])
            text = f"{verb}:\n\n{para}"
        elif paragraphs and form < 0.55:
            chat, text = False, rng.choice(paragraphs)[: rng.randint(120, 300)]
        else:
            kind = rng.choice(["a short story", "a poem", "an essay", "a description", "a blog post"])
            text = f"Write {kind} about {rng.choice(_TOPICS)}."
    elif cat == "math":
        text = _math_prompt(rng)
    elif cat == "chat":
        text = rng.choice([f"Can you explain {rng.choice(_CONCEPTS)} in simple terms?",
                           f"How do I {rng.choice(_TASKS)}?",
                           f"What are some tips to {rng.choice(_TASKS)}?",
                           (f"What is the difference between {rng.choice(_CONCEPTS)} and "
                            f"{rng.choice(_CONCEPTS)}?"),
                           f"Hi! I'm feeling a bit bored today. Any ideas about {rng.choice(_TOPICS)}?",
                           f"Tell me three interesting facts about {rng.choice(_CONCEPTS + _TOPICS)}.",
                           f"Why is {rng.choice(_CONCEPTS)} important?"])
    elif cat == "translation":
        sents = [f"{rng.choice(_SUBJECTS)} {rng.choice(_PREDICATES)}." for _ in range(1 + int(form < 0.4))]
        text = f"Translate into {rng.choice(_LANGS)}: {' '.join(sents)}"
    elif cat == "summarization":
        para = "\n\n".join(rng.sample(paragraphs, 2)) if paragraphs and form < 0.5 else (
            rng.choice(paragraphs) if paragraphs else f"{rng.choice(_SUBJECTS)} {rng.choice(_PREDICATES)}.")
        how = rng.choice(["in two sentences", "in one sentence", "in three bullet points", "for a beginner",
                          "in under fifty words"])
        text = f"Summarize the following text {how}.\n\n{para}"
    elif cat == "qa":
        text = rng.choice(_FACT_QS).format(c=rng.choice(_CONCEPTS))
    else:  # rag: a passage, then a question to answer from it
        para = rng.choice(paragraphs) if paragraphs else f"{rng.choice(_SUBJECTS)} {rng.choice(_PREDICATES)}."
        q = rng.choice(["What is the main point of the passage?", "Which terms does the passage define?",
                        "According to the passage, what should the reader avoid?",
                        "What example does the passage give, and what does it show?",
                        "List two facts stated in the passage."])
        text = f"Answer the question using only the passage.\n\nPassage: {para}\n\nQuestion: {q}"
    return chat, text


# The categories a prompt mix cycles through: v1 is the shipped draft's; v2 adds the request kinds of
# assistant traffic that v1 lacks (translation, summarization, factual questions, passage questions).
PROMPT_MIXES = {"v1": ("code", "prose", "math", "chat"),
                "v2": ("code", "prose", "math", "chat", "translation", "summarization", "qa", "rag")}


def make_prompts(n, sources, seed=0, pydoc=None, mix="v1"):
    """``n`` prompts cycling through the categories of ``mix`` (PROMPT_MIXES): dicts of ``category``,
    ``chat`` (bool: wrap in the chat template) and ``text``."""
    if mix not in PROMPT_MIXES:
        raise ValueError(f"prompt mix must be one of {sorted(PROMPT_MIXES)}, got {mix!r}")
    rng = random.Random(seed)
    funcs = functions_with_summaries(sources)
    paragraphs = [p.strip() for _, t in (pydoc or []) for p in t.split("\n\n") if 200 < len(p.strip()) < 900]
    snips = ("\n".join(lines[i:i + 12]).strip() for lines in (text.split("\n") for _, text in sources[:400])
             for i in range(0, max(1, len(lines) - 12), 97))  # 12-line windows, every 97 lines
    code_snips = [snip for snip in snips if snip.count("\n") >= 6 and len(snip) < 700]
    cats = PROMPT_MIXES[mix]
    out = []
    for i in range(n):
        cat = cats[i % len(cats)]
        chat, text = _prompt(cat, rng, funcs, paragraphs, code_snips)
        out.append({"category": cat, "chat": chat, "text": text})
    return out


def prompt_text(tokenizer, text, chat):
    """``text`` as the model sees it: with ``chat``, a user turn in the tokenizer's chat template if any."""
    if not (chat and getattr(tokenizer, "chat_template", None)):
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


# Held out: none of these strings come from the templates above.
EVAL_PROMPTS = {
    "code": ["Write a Python class for a bank account with deposit and withdraw methods.",
             "How do I read a JSON file in Python and print its keys?",
             "Write a function that returns the n-th triangular number, with a docstring.",
             "def quicksort(items):\n    \"\"\"Sort a list using quicksort.\"\"\"\n"],
    "prose": ["Write a short story about a girl who finds a map in her grandmother's attic.",
              "Describe a busy market on a Saturday morning.",
              "Once upon a time, in a small fishing village by the sea, there lived an old sailor who",
              "Write a paragraph about why reading books matters."],
    "math": ["What is 15% of 240?",
             "A car uses 6 liters of fuel per 100 km. How much fuel does it need for 350 km?",
             "Solve 2x - 7 = 11 and show your steps.",
             "What is the sum of the first 20 positive integers?"],
    "chat": ["Hello! Who are you?",
             "What should I cook for dinner tonight?",
             "Can you recommend a good way to learn programming?",
             "What are the benefits of drinking water?"],
    "translation": ["Translate into French: The shop around the corner sells the best coffee in town.",
                    "Translate into Spanish: We missed the last bus, so we walked home under the stars.",
                    "Translate into German: Please send me the report before the meeting on Thursday.",
                    "Translate into Italian: The children built a sandcastle that the tide washed away."],
    "summarization": [("Summarize in one sentence: The school library has extended its opening hours during "
                      "the exam period. Students can now study there until ten in the evening, and extra "
                      "tables have been placed in the corridor. Librarians ask that food stays outside."),
                      ("Summarize the main idea: Cycling to work has grown popular in the city since new "
                      "protected lanes opened. Commuters report shorter journeys and lower costs, though "
                      "some shop owners worry about losing parking spaces in front of their stores."),
                      ("Give a two-sentence summary: A small company released an app that reminds people to "
                      "water their plants. It uses the local weather forecast to skip days when it rains, "
                      "and it sends a photo reminder of each plant."),
                      ("Summarize for a child: Bees carry pollen from flower to flower, which helps plants "
                      "make fruit and seeds. Without bees, many foods we eat would become rare.")],
    "qa": ["What causes the seasons on Earth?", "How do vaccines train the immune system?",
           "Why is the ocean salty?", "What does a central bank do?"],
    "rag": [("Read the passage and answer.\n\nPassage: The town pool reopened in June after a year of "
            "renovation. It now has a heated lane for swimming lessons and a shallow area for toddlers. "
            "Entry costs four euros for adults and is free for children under six.\n\nQuestion: "
            "Who can swim for free?"),
            ("Read the passage and answer.\n\nPassage: The Ridge Trail is 12 km long and climbs 600 "
            "metres. Hikers should carry water because there are no springs after the first hut. The trail "
            "is closed in winter.\n\nQuestion: Why should hikers carry water?"),
            ("Read the passage and answer.\n\nPassage: Our office moves to the third floor on Monday. "
            "Desks will be assigned by team, and the old kitchen stays open until Friday.\n\nQuestion: "
            "When does the move happen and what stays open?"),
            ("Read the passage and answer.\n\nPassage: The recipe needs two eggs, 200 grams of flour and a "
            "cup of milk. Mix the dry ingredients first, then add the eggs and milk slowly.\n\nQuestion: "
            "What should be mixed first?")],
}
EVAL_CHAT = {"code": [True, True, True, False], "prose": [True, True, False, True],
             "math": [True, True, True, True], "chat": [True, True, True, True],
             **{c: [True] * 4 for c in ("translation", "summarization", "qa", "rag")}}
