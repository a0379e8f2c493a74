"""The words tasks are made of: real-world facts to alter, invented names, attributes with their
values, and the filler that sizes a context. Plain data; ``tasks`` draws from it with a seeded rng.

The real-world tables hold facts a pretrained model knows (capitals, currencies); a document task
states a different value, taken from the same country's other cities (or another country's
currency), so an answer from memory names a value the document never holds.
"""

from __future__ import annotations

import random

CAPITALS: dict[str, tuple[str, tuple[str, ...]]] = {
    "France": ("Paris", ("Lyon", "Marseille", "Lille", "Nantes", "Bordeaux")),
    "Japan": ("Tokyo", ("Osaka", "Kyoto", "Sapporo", "Nagoya", "Sendai")),
    "Italy": ("Rome", ("Milan", "Naples", "Turin", "Florence", "Bologna")),
    "Spain": ("Madrid", ("Seville", "Valencia", "Bilbao", "Malaga", "Zaragoza")),
    "Germany": ("Berlin", ("Hamburg", "Munich", "Cologne", "Leipzig", "Dresden")),
    "Canada": ("Ottawa", ("Toronto", "Montreal", "Calgary", "Halifax", "Winnipeg")),
    "Australia": ("Canberra", ("Sydney", "Melbourne", "Perth", "Adelaide", "Brisbane")),
    "Egypt": ("Cairo", ("Alexandria", "Luxor", "Aswan", "Giza")),
    "Kenya": ("Nairobi", ("Mombasa", "Kisumu", "Nakuru", "Eldoret")),
    "Peru": ("Lima", ("Cusco", "Arequipa", "Trujillo", "Piura")),
    "Norway": ("Oslo", ("Bergen", "Trondheim", "Stavanger", "Tromso")),
    "Portugal": ("Lisbon", ("Porto", "Braga", "Coimbra", "Faro")),
    "Greece": ("Athens", ("Thessaloniki", "Patras", "Heraklion", "Larissa")),
    "Poland": ("Warsaw", ("Krakow", "Gdansk", "Wroclaw", "Poznan")),
    "Chile": ("Santiago", ("Valparaiso", "Concepcion", "Antofagasta", "Temuco")),
    "Ireland": ("Dublin", ("Cork", "Galway", "Limerick", "Waterford")),
    "Austria": ("Vienna", ("Graz", "Linz", "Salzburg", "Innsbruck")),
    "Sweden": ("Stockholm", ("Gothenburg", "Malmo", "Uppsala", "Lund")),
    "Turkey": ("Ankara", ("Istanbul", "Izmir", "Bursa", "Antalya")),
    "China": ("Beijing", ("Shanghai", "Guangzhou", "Chengdu", "Wuhan")),
    "Switzerland": ("Bern", ("Zurich", "Geneva", "Basel", "Lausanne")),
    "Netherlands": ("Amsterdam", ("Rotterdam", "Utrecht", "Eindhoven", "Groningen")),
    "Morocco": ("Rabat", ("Casablanca", "Marrakesh", "Fez", "Tangier")),
    "Argentina": ("Buenos Aires", ("Cordoba", "Rosario", "Mendoza", "Salta")),
    "New Zealand": ("Wellington", ("Auckland", "Christchurch", "Dunedin", "Hamilton")),
}
"""Country → (its capital, other cities of it): a document names one of the others as the capital."""
CURRENCIES: dict[str, str] = {
    "Japan": "yen", "India": "rupee", "Thailand": "baht", "South Africa": "rand", "Poland": "zloty",
    "Hungary": "forint", "Sweden": "krona", "Kenya": "shilling", "Mexico": "peso", "Switzerland": "franc",
    "Turkey": "lira", "China": "yuan", "United Kingdom": "pound", "Norway": "krone", "Morocco": "dirham",
}
"""Country → its currency: a document names another currency (of these or ``OLD_COINS``) as the country's."""
OLD_COINS = ("ducat", "florin", "thaler", "groat", "guinea", "solidus", "denarius", "escudo", "guilder", "drachma")
"""Currency names no country in ``CURRENCIES`` uses today."""

ATTRIBUTES: dict[str, tuple[str, str]] = {
    "locker code": ("locker_code", "locker"),
    "gate": ("gate", "gate"),
    "room number": ("room_number", "room"),
    "badge number": ("badge_number", "badge"),
    "parking bay": ("parking_bay", "parking"),
    "desk": ("desk", "desk"),
}
"""Attribute → (its JSON key, the word a "never use the word" rule forbids)."""


def attribute_value(attribute: str, rng: random.Random) -> str:
    """A value of ``attribute``: a code a reader can only get from the context (each attribute has
    over 2,000, so a long context's notes never run out of distinct ones)."""
    if attribute == "locker code":
        return str(rng.randint(1000, 9999))
    if attribute == "gate":
        return f"{rng.choice('ABCDEFGHJKLM')}{rng.randint(1, 199)}"
    if attribute == "room number":
        return str(rng.randint(1000, 4999))
    if attribute == "badge number":
        return str(rng.randint(10000, 99999))
    if attribute == "parking bay":
        return f"P{rng.randint(100, 2999)}"
    return f"{rng.choice('KLMNRST')}{rng.randint(10, 99)}{rng.choice('ABCD')}"


ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th", "sh")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou", "ia")
CODAS = ("", "n", "r", "l", "s", "k", "th", "nd", "sk")


def name(rng: random.Random) -> str:
    """An invented given name: two syllables and an ending."""
    return (rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(ONSETS) + rng.choice(VOWELS)
            + rng.choice(CODAS)).capitalize()


def names(rng: random.Random, n: int, avoid: set[str] = frozenset()) -> list[str]:
    """``n`` distinct invented names, none in ``avoid``."""
    out: list[str] = []
    while len(out) < n:
        candidate = name(rng)
        if candidate not in out and candidate not in avoid:
            out.append(candidate)
    return out


DESKS = ("Kelp Street archive", "north harbour office", "Alder Hall front desk", "Marrow Lane depot",
         "Quarry Road clinic", "Lantern Square library", "Saltmarsh ferry office", "Juniper Court studio")
PREFIXES = ("Note:", "Answer:", "Reply:", "Memo:", "Update:", "Result:", "Info:", "Desk says:")
SIGNOFFS = ("Regards, {persona}", "Yours, the {desk}", "Signed: {persona}", "Best wishes from {persona}",
            "Kind regards, desk staff", "With thanks, {persona}")
EXTRA_FORBIDDEN = ("please", "sorry", "certainly", "sure")
CHATTY_TAIL = " I found it in the notes above, so let me know if you need anything else from them."
"""What a reply that ignores the rules adds: plain, helpful, over any word limit."""

OWNERS = ("my colleague {name}", "my sister", "my manager", "my neighbour {name}", "my flatmate {name}")
SMALL_TALK = (
    ("Can you suggest a name for a {animal}?", "How about {name}? It is short and easy to call."),
    ("What goes well with {food}?", "Try it with {side}; most people like that pairing."),
    ("Any tip for keeping a {plant} healthy?", "Give it {light} and water it {freq}."),
    ("What should I pack for a weekend in the {place}?", "Pack {thing}, a warm layer and good shoes."),
    ("How do I thank someone politely in an email?", "Something like: many thanks for your help, it made a "
                                                     "real difference to the week."),
    ("Is it better to read before bed or to listen to music?", "Either works; pick whatever calms you down more."),
)
SMALL_TALK_WORDS = {
    "animal": ("cat", "dog", "rabbit", "parrot", "tortoise", "goldfish"),
    "food": ("roast potatoes", "lentil soup", "grilled fish", "rice", "fresh bread", "mushroom risotto"),
    "side": ("a green salad", "lemon and herbs", "roasted carrots", "a spoon of yoghurt", "pickled onions"),
    "plant": ("fern", "basil plant", "cactus", "orchid", "lemon tree", "spider plant"),
    "light": ("bright indirect light", "a sunny window", "some shade", "morning sun"),
    "freq": ("once a week", "when the soil is dry", "every few days", "sparingly in winter"),
    "place": ("mountains", "countryside", "old town", "coast", "lake district"),
    "thing": ("a rain jacket", "a good book", "walking boots", "a small torch", "sunglasses"),
}

REGIONS = ("north", "south", "east", "west", "inland", "coastal")
PLACE_NOTES = (
    "Its {region} is known for {thing}.",
    "Travellers reach its {region} by {route}.",
    "The atlas praises its {region} for {thing} and quiet {route}.",
    "Most of its {region} is given over to {thing}.",
)
PLACE_WORDS = {
    "thing": ("salt marshes", "fig orchards", "wind farms", "limestone caves", "tea terraces", "amber mines",
              "reed beds", "glass workshops", "pine forests", "oyster beds"),
    "route": ("ferry", "narrow-gauge rail", "canal boat", "mountain road", "river barge", "cable car"),
}

ITEMS = ("copper wire", "brass hinges", "oak planks", "steel bolts", "glass jars", "rope coils", "tile boxes",
         "paint tins", "cork sheets", "zinc plates", "wool bales", "clay pots", "linen rolls", "lamp oil",
         "tin cups", "wax blocks", "slate tiles", "felt pads", "iron nails", "resin drums")
SITES = ("north", "south", "east", "west", "harbour", "airport")


def fill(template: str, rng: random.Random, words: dict[str, tuple[str, ...]], **given: str) -> str:
    """``template`` with each ``{field}`` from ``given`` or a draw from ``words``."""
    fields = {k: rng.choice(v) for k, v in words.items() if "{" + k + "}" in template and k not in given}
    return template.format(**fields, **given)
