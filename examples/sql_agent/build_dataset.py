"""Build the bundled text-to-SQL dataset (databases + questions) deterministically.

Spider cannot be downloaded offline, so this script generates a dataset "in
the spirit of Spider": SQLite databases from many domains (ten hand-specified
here give dev, test and six training databases; the domains of ``domains.py``
and merges of two training domains give the other training databases), each in
its own naming and key conventions, with 80 natural-language questions per
database with gold SQL. Questions come from generic templates in four
tiers (``easy``, ``medium``, ``join``, ``hard``) that are filled with values
drawn from the generated data, and every gold query is executed during the
build: queries with empty results, more than 200 rows, or an ambiguous order
(ties under ORDER BY/LIMIT) are discarded. The split is by database.

Everything is driven by one seeded ``random.Random`` and the standard library,
so running the script twice produces byte-identical files::

    python -m examples.sql_agent.build_dataset          # rebuilds examples/sql_agent/data/

``build(out_dir)`` is the programmatic entry point (used by the tests).
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SEED = 20240611
QUESTIONS_PER_DB = 80
TIER_QUOTA: dict[str, int] = {"easy": 28, "medium": 24, "join": 16, "hard": 12}
MAX_RESULT_ROWS = 200
SPLIT_OF_DB: dict[str, str] = {
    "school": "train",
    "hospital": "train",
    "airline": "train",
    "shop": "train",
    "music": "train",
    "cinema": "train",
    "company": "dev",
    "restaurants": "dev",
    "library": "test",
    "sports": "test",
}
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "data"
#: Hand-written databases (``<db_id>.sql``: schema + data) and their questions (``questions.jsonl``), designed apart
#: from the generator: other domains, naming and key conventions, SQL features and phrasing than any template's.
INDEPENDENT_DIR = HERE / "independent"
INDEPENDENT_SPLIT = "independent"

# ---------------------------------------------------------------------------
# Word lists
# ---------------------------------------------------------------------------

FIRST = (
    "James",
    "Maria",
    "Robert",
    "Linda",
    "Michael",
    "Sarah",
    "David",
    "Emma",
    "Daniel",
    "Olivia",
    "Thomas",
    "Sofia",
    "Carlos",
    "Aisha",
    "Kenji",
    "Priya",
    "Lucas",
    "Chloe",
    "Omar",
    "Hannah",
    "Mateo",
    "Grace",
    "Ivan",
    "Nora",
    "Samuel",
    "Leila",
    "Victor",
    "Julia",
    "Hugo",
    "Mei",
    "Andre",
    "Elena",
    "Felix",
    "Zara",
    "Pablo",
    "Ingrid",
    "Tariq",
    "Rosa",
    "Noah",
    "Yuki",
)
LAST = (
    "Smith",
    "Garcia",
    "Johnson",
    "Lopez",
    "Brown",
    "Nguyen",
    "Miller",
    "Patel",
    "Wilson",
    "Kim",
    "Anderson",
    "Rossi",
    "Taylor",
    "Silva",
    "Moore",
    "Tanaka",
    "Clark",
    "Muller",
    "Lewis",
    "Novak",
    "Walker",
    "Haddad",
    "Young",
    "Costa",
    "King",
    "Ivanova",
    "Wright",
    "Okafor",
    "Scott",
    "Larsen",
    "Green",
    "Dubois",
    "Baker",
    "Sato",
    "Hall",
    "Kowalski",
    "Adams",
    "Fischer",
    "Rivera",
    "Chen",
)
CITIES = (
    "Springfield",
    "Riverton",
    "Lakeside",
    "Fairview",
    "Kingston",
    "Georgetown",
    "Ashford",
    "Millbrook",
    "Brighton",
    "Oakdale",
)
COUNTRIES = (
    "USA",
    "Canada",
    "France",
    "Germany",
    "Japan",
    "Brazil",
    "Italy",
    "Spain",
    "India",
    "Australia",
)

NameGen = Callable[[random.Random], str]


def person(rng: random.Random) -> str:
    """A first + last name."""
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def combo(*parts: Sequence[str], template: str = "{}") -> NameGen:
    """Name generator joining one random word from each list, then formatting ``template``."""

    def gen(rng: random.Random) -> str:
        return template.format(" ".join(rng.choice(p) for p in parts))

    return gen


def code(prefixes: Sequence[str], lo: int, hi: int, sep: str = "") -> NameGen:
    """Identifier-like names such as ``AX412`` or ``ORD-1017``."""

    def gen(rng: random.Random) -> str:
        return f"{rng.choice(prefixes)}{sep}{rng.randint(lo, hi)}"

    return gen


# ---------------------------------------------------------------------------
# Schema specification
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A column plus what the question templates need to talk about it.

    ``kind`` is ``name`` (unique human-readable label of a row), ``cat``
    (categorical text), ``int``/``real`` (numbers), ``fk`` (foreign key to
    ``ref``'s key column ``ref_key``; ``role`` names the referenced row from
    this table's point of view, e.g. "destination airport") or ``extra`` (a
    distractor column no question asks about, filled from ``values``).
    """

    name: str
    kind: str
    phrase: str = ""
    plural: str = ""
    values: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    lo: float = 0
    hi: float = 0
    step: int = 1
    decimals: int = 2
    gen: NameGen | tuple[str, ...] | None = None
    ref: str = ""
    ref_key: str = "id"
    role: str = ""
    role_plural: str = ""

    @property
    def sql_type(self) -> str:
        if self.kind in ("int", "fk"):
            return "INTEGER"
        if self.kind == "extra":
            return "INTEGER" if isinstance(self.values[0], int) else "TEXT"
        if self.kind == "real":
            return "REAL"
        return "TEXT"


def name(col: str = "name", phrase: str = "name", plural: str = "names", *, gen: NameGen | tuple[str, ...]) -> Col:
    return Col(col, "name", phrase, plural, gen=gen)


def cat(col: str, phrase: str, plural: str, values: Sequence[str]) -> Col:
    return Col(col, "cat", phrase, plural, values=tuple(values))


def num(col: str, phrase: str, lo: float, hi: float, step: int = 1) -> Col:
    return Col(col, "int", phrase, lo=lo, hi=hi, step=step)


def real(col: str, phrase: str, lo: float, hi: float, decimals: int = 2) -> Col:
    return Col(col, "real", phrase, lo=lo, hi=hi, decimals=decimals)


def fk(col: str, ref: str, role: str, role_plural: str) -> Col:
    return Col(col, "fk", ref=ref, role=role, role_plural=role_plural)


@dataclass(frozen=True)
class Table:
    """A table. ``pk`` is its integer key column; ``bridge`` tables (many-to-many links) have none, their key is
    the pair of foreign keys (composite), and the pairs are unique.

    ``link``/``rlink`` phrase the many-to-many relation from the first and the
    second foreign key's table ("students *enrolled in* the course X",
    "courses *taken by* the student Y"). ``quote`` wraps row names in double
    quotes inside questions (titles), person names are left bare.
    """

    name: str
    singular: str
    plural: str
    rows: int
    cols: tuple[Col, ...]
    bridge: bool = False
    link: str = ""
    rlink: str = ""
    quote: bool = False
    pk: str = "id"
    types: str = "sqlite"
    fk_clause: str = "inline"

    @property
    def name_col(self) -> Col | None:
        return next((c for c in self.cols if c.kind == "name"), None)

    @property
    def cats(self) -> list[Col]:
        return [c for c in self.cols if c.kind == "cat"]

    @property
    def nums(self) -> list[Col]:
        return [c for c in self.cols if c.kind in ("int", "real")]

    @property
    def fks(self) -> list[Col]:
        return [c for c in self.cols if c.kind == "fk"]

    def column_type(self, sql_type: str) -> str:
        """``sql_type`` (INTEGER, TEXT or REAL) as this table's DDL spells it: SQLite's own names, or the ``ansi``
        spellings a schema ported from another engine carries (INT, VARCHAR(n), FLOAT: the same affinities)."""
        if self.types == "sqlite":
            return sql_type
        return {"INTEGER": "INT", "TEXT": "VARCHAR(80)", "REAL": "FLOAT"}[sql_type]

    def ddl(self) -> str:
        """Compact one-line CREATE TABLE statement; foreign keys inline (``col INTEGER REFERENCES t(k)``) or as
        table constraints at the end (``FOREIGN KEY (col) REFERENCES t(k)``), as ``fk_clause`` says."""
        integer, text = self.column_type("INTEGER"), self.column_type("TEXT")
        parts = [] if self.bridge else [f"{self.pk} {integer} PRIMARY KEY"]
        constraints = []
        for c in self.cols:
            if c.kind == "fk":
                reference = f"REFERENCES {c.ref}({c.ref_key})"
                if self.fk_clause == "inline":
                    parts.append(f"{c.name} {integer} {reference}")
                else:
                    parts.append(f"{c.name} {integer} NOT NULL")
                    constraints.append(f"FOREIGN KEY ({c.name}) {reference}")
            elif c.kind == "name":
                parts.append(f"{c.name} {text} NOT NULL UNIQUE")
            else:
                parts.append(f"{c.name} {self.column_type(c.sql_type)}")
        if self.bridge:
            keys = ", ".join(c.name for c in self.fks)
            parts.append(f"PRIMARY KEY ({keys})")
        return f"CREATE TABLE {self.name} ({', '.join([*parts, *constraints])});"


@dataclass(frozen=True)
class Db:
    """A database: an id, a one-line description and tables in creation order."""

    db_id: str
    description: str
    tables: tuple[Table, ...]

    def table(self, name_: str) -> Table:
        return next(t for t in self.tables if t.name == name_)


# ---------------------------------------------------------------------------
# The ten databases
# ---------------------------------------------------------------------------

DEPT_NAMES = (
    "Mathematics",
    "Physics",
    "Chemistry",
    "Biology",
    "History",
    "Economics",
    "Philosophy",
    "Computer Science",
    "Literature",
    "Music",
    "Geology",
    "Psychology",
)
TOPICS = (
    "Algebra",
    "Calculus",
    "Statistics",
    "Genetics",
    "Ecology",
    "Optics",
    "Mechanics",
    "Databases",
    "Algorithms",
    "Poetry",
    "Ethics",
    "Logic",
    "Microeconomics",
    "Thermodynamics",
    "Cell Biology",
    "World History",
    "Music Theory",
    "Linguistics",
    "Mineralogy",
    "Cognition",
)

DATABASES: tuple[Db, ...] = (
    Db(
        "school",
        "university: departments, instructors, courses, students and enrollments",
        (
            Table(
                "departments",
                "department",
                "departments",
                12,
                (
                    name(gen=DEPT_NAMES),
                    cat(
                        "building",
                        "building",
                        "buildings",
                        ("North Hall", "South Hall", "Science Center", "Arts Building"),
                    ),
                    num("budget", "budget", 200000, 900000, 5000),
                ),
            ),
            Table(
                "instructors",
                "instructor",
                "instructors",
                40,
                (
                    name(gen=person),
                    fk("department_id", "departments", "department", "departments"),
                    cat(
                        "rank", "rank", "ranks", ("Lecturer", "Assistant Professor", "Associate Professor", "Professor")
                    ),
                    num("salary", "salary", 50000, 150000, 500),
                    num("hire_year", "hire year", 1995, 2023),
                ),
            ),
            Table(
                "courses",
                "course",
                "courses",
                50,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(("Introduction to", "Advanced", "Topics in", "Foundations of", "Applied"), TOPICS),
                    ),
                    fk("department_id", "departments", "department", "departments"),
                    num("credits", "number of credits", 1, 5),
                    cat("level", "level", "levels", ("Introductory", "Intermediate", "Advanced")),
                ),
                quote=True,
            ),
            Table(
                "students",
                "student",
                "students",
                150,
                (
                    name(gen=person),
                    cat("major", "major", "majors", DEPT_NAMES[:8]),
                    num("year", "year of study", 1, 4),
                    real("gpa", "GPA", 2.0, 4.0),
                ),
            ),
            Table(
                "enrollments",
                "enrollment",
                "enrollments",
                300,
                (
                    fk("student_id", "students", "student", "students"),
                    fk("course_id", "courses", "course", "courses"),
                    num("grade", "grade", 40, 100),
                    cat("semester", "semester", "semesters", ("Fall 2023", "Spring 2024", "Fall 2024")),
                ),
                bridge=True,
                link="enrolled in",
                rlink="taken by",
            ),
        ),
    ),
    Db(
        "library",
        "public library: authors, books, members and loans",
        (
            Table(
                "authors",
                "author",
                "authors",
                40,
                (
                    name(gen=person),
                    cat("country", "country", "countries", COUNTRIES),
                    num("birth_year", "birth year", 1920, 1995),
                ),
            ),
            Table(
                "books",
                "book",
                "books",
                120,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Hidden",
                                "Silent",
                                "Crimson",
                                "Broken",
                                "Golden",
                                "Forgotten",
                                "Distant",
                                "Winter",
                                "Secret",
                                "Wandering",
                                "Burning",
                                "Last",
                                "Quiet",
                                "Iron",
                            ),
                            (
                                "River",
                                "Garden",
                                "Harbor",
                                "Kingdom",
                                "Letter",
                                "Mountain",
                                "Voyage",
                                "Orchard",
                                "Lighthouse",
                                "Promise",
                                "Empire",
                                "Shadow",
                                "Island",
                                "Road",
                            ),
                            template="The {}",
                        ),
                    ),
                    fk("author_id", "authors", "author", "authors"),
                    cat(
                        "genre",
                        "genre",
                        "genres",
                        ("Fiction", "Mystery", "Science Fiction", "Biography", "History", "Poetry", "Fantasy"),
                    ),
                    num("pages", "number of pages", 90, 900),
                    num("publication_year", "publication year", 1950, 2023),
                ),
                quote=True,
            ),
            Table(
                "members",
                "member",
                "members",
                80,
                (
                    name(gen=person),
                    cat("city", "city", "cities", CITIES),
                    cat(
                        "membership_type",
                        "membership type",
                        "membership types",
                        ("Standard", "Premium", "Student", "Senior"),
                    ),
                    num("join_year", "join year", 2010, 2024),
                ),
            ),
            Table(
                "loans",
                "loan",
                "loans",
                250,
                (
                    fk("member_id", "members", "member", "members"),
                    fk("book_id", "books", "book", "books"),
                    num("loan_days", "loan duration in days", 1, 60),
                    cat("status", "status", "statuses", ("returned", "overdue", "active")),
                ),
                bridge=True,
                link="who borrowed",
                rlink="borrowed by",
            ),
        ),
    ),
    Db(
        "hospital",
        "hospital: departments, doctors, patients and appointments",
        (
            Table(
                "departments",
                "department",
                "departments",
                10,
                (
                    name(
                        gen=(
                            "Cardiology",
                            "Neurology",
                            "Oncology",
                            "Pediatrics",
                            "Orthopedics",
                            "Radiology",
                            "Emergency",
                            "Dermatology",
                            "Psychiatry",
                            "Surgery",
                        )
                    ),
                    num("floor", "floor", 1, 8),
                    num("beds", "number of beds", 10, 120),
                ),
            ),
            Table(
                "doctors",
                "doctor",
                "doctors",
                45,
                (
                    name(gen=person),
                    fk("department_id", "departments", "department", "departments"),
                    cat("position", "position", "positions", ("Resident", "Attending", "Consultant", "Chief")),
                    num("years_experience", "years of experience", 1, 35),
                    num("salary", "salary", 60000, 300000, 1000),
                ),
            ),
            Table(
                "patients",
                "patient",
                "patients",
                150,
                (
                    name(gen=person),
                    cat("gender", "gender", "genders", ("female", "male")),
                    num("age", "age", 1, 95),
                    cat("city", "city", "cities", CITIES),
                    cat("insurance", "insurance type", "insurance types", ("Public", "Private", "Employer")),
                ),
            ),
            Table(
                "appointments",
                "appointment",
                "appointments",
                300,
                (
                    fk("patient_id", "patients", "patient", "patients"),
                    fk("doctor_id", "doctors", "doctor", "doctors"),
                    real("cost", "cost", 50, 900),
                    cat("status", "status", "statuses", ("completed", "cancelled", "scheduled", "no-show")),
                ),
                bridge=True,
                link="who had appointments with",
                rlink="who had appointments with",
            ),
        ),
    ),
    Db(
        "airline",
        "air travel: airlines, airports, pilots and flights",
        (
            Table(
                "airlines",
                "airline",
                "airlines",
                12,
                (
                    name(
                        gen=(
                            "Skyward Air",
                            "Blue Horizon",
                            "Northern Wings",
                            "Pacific Jet",
                            "Aurora Airways",
                            "Coastal Air",
                            "Summit Airlines",
                            "Meridian Air",
                            "Falcon Express",
                            "Polar Airways",
                            "Sunline",
                            "Atlas Air Lines",
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    num("founded_year", "founding year", 1930, 2015),
                    num("fleet_size", "fleet size", 10, 300),
                ),
            ),
            Table(
                "airports",
                "airport",
                "airports",
                25,
                (
                    name(
                        gen=combo(
                            (
                                "Lisbon",
                                "Osaka",
                                "Denver",
                                "Nairobi",
                                "Oslo",
                                "Lima",
                                "Perth",
                                "Dublin",
                                "Seoul",
                                "Cairo",
                                "Vienna",
                                "Quito",
                                "Hanoi",
                                "Porto",
                                "Austin",
                                "Zurich",
                                "Accra",
                                "Bergen",
                                "Tucson",
                                "Kyoto",
                                "Malaga",
                                "Calgary",
                                "Tampa",
                                "Leeds",
                                "Nagoya",
                                "Geneva",
                                "Madrid",
                                "Boston",
                            ),
                            template="{} Airport",
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    num("elevation", "elevation", 0, 2500, 5),
                    num("terminals", "number of terminals", 1, 6),
                ),
            ),
            Table(
                "pilots",
                "pilot",
                "pilots",
                60,
                (
                    name(gen=person),
                    fk("airline_id", "airlines", "airline", "airlines"),
                    cat("rank", "rank", "ranks", ("First Officer", "Captain", "Senior Captain")),
                    num("age", "age", 25, 64),
                    num("flight_hours", "flight hours", 1000, 25000, 10),
                ),
            ),
            Table(
                "flights",
                "flight",
                "flights",
                200,
                (
                    name(
                        "flight_number",
                        "flight number",
                        "flight numbers",
                        gen=code(("AX", "BH", "NW", "PJ", "AU", "CA", "SL"), 100, 999),
                    ),
                    fk("airline_id", "airlines", "airline", "airlines"),
                    fk("destination_id", "airports", "destination airport", "destination airports"),
                    num("distance", "distance", 200, 9000, 10),
                    real("price", "ticket price", 49, 1500),
                    cat("status", "status", "statuses", ("on time", "delayed", "cancelled")),
                ),
            ),
        ),
    ),
    Db(
        "shop",
        "online shop: customers, products, orders and order items",
        (
            Table(
                "customers",
                "customer",
                "customers",
                90,
                (
                    name(gen=person),
                    cat("city", "city", "cities", CITIES),
                    cat("segment", "segment", "segments", ("Consumer", "Corporate", "Small Business")),
                    num("signup_year", "signup year", 2015, 2024),
                ),
            ),
            Table(
                "products",
                "product",
                "products",
                60,
                (
                    name(
                        gen=combo(
                            ("Nova", "Zen", "Aero", "Terra", "Luma", "Vivo", "Orbit", "Pulse", "Echo", "Sierra"),
                            (
                                "Lamp",
                                "Blender",
                                "Backpack",
                                "Kettle",
                                "Speaker",
                                "Notebook",
                                "Tent",
                                "Headphones",
                                "Desk",
                                "Drone",
                            ),
                        )
                    ),
                    cat(
                        "category",
                        "category",
                        "categories",
                        ("Electronics", "Kitchen", "Outdoor", "Toys", "Office", "Beauty"),
                    ),
                    real("price", "price", 5, 900),
                    num("stock", "stock", 0, 500),
                ),
                quote=True,
            ),
            Table(
                "orders",
                "order",
                "orders",
                200,
                (
                    name("order_code", "order code", "order codes", gen=code(("ORD",), 1000, 9999, "-")),
                    fk("customer_id", "customers", "customer", "customers"),
                    num("order_year", "order year", 2019, 2024),
                    cat("status", "status", "statuses", ("delivered", "shipped", "processing", "returned")),
                    real("shipping_cost", "shipping cost", 0, 30),
                ),
            ),
            Table(
                "order_items",
                "order item",
                "order items",
                350,
                (
                    fk("order_id", "orders", "order", "orders"),
                    fk("product_id", "products", "product", "products"),
                    num("quantity", "quantity", 1, 10),
                ),
                bridge=True,
                link="that contain",
                rlink="contained in",
            ),
        ),
    ),
    Db(
        "music",
        "live music: artists, albums, venues and concerts",
        (
            Table(
                "artists",
                "artist",
                "artists",
                40,
                (
                    name(
                        gen=combo(
                            (
                                "Velvet",
                                "Neon",
                                "Silver",
                                "Midnight",
                                "Electric",
                                "Golden",
                                "Crystal",
                                "Wild",
                                "Lunar",
                                "Scarlet",
                                "Hollow",
                                "Static",
                            ),
                            (
                                "Echoes",
                                "Foxes",
                                "Tide",
                                "Parade",
                                "Riders",
                                "Lights",
                                "Owls",
                                "Bloom",
                                "Circuit",
                                "Horizon",
                                "Dreamers",
                                "Saints",
                            ),
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    cat(
                        "genre",
                        "genre",
                        "genres",
                        ("Rock", "Pop", "Jazz", "Hip Hop", "Electronic", "Folk", "Classical"),
                    ),
                    num("debut_year", "debut year", 1970, 2020),
                ),
                quote=True,
            ),
            Table(
                "albums",
                "album",
                "albums",
                120,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Midnight",
                                "Summer",
                                "Broken",
                                "Endless",
                                "Quiet",
                                "Paper",
                                "Northern",
                                "Burning",
                                "Hidden",
                                "Falling",
                                "Open",
                                "Electric",
                            ),
                            (
                                "Dreams",
                                "Roads",
                                "Skies",
                                "Letters",
                                "Hearts",
                                "Cities",
                                "Waves",
                                "Mirrors",
                                "Fires",
                                "Gardens",
                                "Stars",
                                "Rooms",
                            ),
                        ),
                    ),
                    fk("artist_id", "artists", "artist", "artists"),
                    num("release_year", "release year", 1975, 2024),
                    num("copies_sold", "number of copies sold", 1000, 2000000, 1000),
                    num("tracks", "number of tracks", 6, 18),
                ),
                quote=True,
            ),
            Table(
                "venues",
                "venue",
                "venues",
                20,
                (
                    name(
                        gen=combo(
                            ("Grand", "Riverside", "Royal", "Harbor", "Union", "Starlight", "Crown", "Echo", "Summit"),
                            ("Hall", "Arena", "Theater", "Pavilion", "Ballroom", "Stadium"),
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("capacity", "capacity", 500, 60000, 100),
                ),
                quote=True,
            ),
            Table(
                "concerts",
                "concert",
                "concerts",
                150,
                (
                    fk("artist_id", "artists", "artist", "artists"),
                    fk("venue_id", "venues", "venue", "venues"),
                    num("year", "year", 2015, 2024),
                    real("ticket_price", "ticket price", 15, 250),
                    num("attendance", "attendance", 200, 50000, 10),
                ),
                bridge=True,
                link="who performed at",
                rlink="that hosted",
            ),
        ),
    ),
    Db(
        "sports",
        "football league: teams, players, coaches and sponsors",
        (
            Table(
                "teams",
                "team",
                "teams",
                16,
                (
                    name(
                        gen=combo(
                            CITIES,
                            (
                                "Hawks",
                                "Lions",
                                "Rovers",
                                "United",
                                "Wolves",
                                "Rangers",
                                "Falcons",
                                "Tigers",
                                "Pirates",
                                "Comets",
                            ),
                        )
                    ),
                    cat("conference", "conference", "conferences", ("Eastern", "Western")),
                    num("founded_year", "founding year", 1880, 2010),
                    num("stadium_capacity", "stadium capacity", 5000, 80000, 100),
                ),
            ),
            Table(
                "players",
                "player",
                "players",
                180,
                (
                    name(gen=person),
                    fk("team_id", "teams", "team", "teams"),
                    cat("position", "position", "positions", ("Goalkeeper", "Defender", "Midfielder", "Forward")),
                    num("age", "age", 18, 38),
                    num("goals", "number of goals", 0, 30),
                    num("salary", "salary", 40000, 2000000, 1000),
                ),
            ),
            Table(
                "coaches",
                "coach",
                "coaches",
                20,
                (
                    name(gen=person),
                    fk("team_id", "teams", "team", "teams"),
                    cat("nationality", "nationality", "nationalities", COUNTRIES),
                    num("experience_years", "years of experience", 1, 30),
                ),
            ),
            Table(
                "sponsors",
                "sponsor",
                "sponsors",
                30,
                (
                    name(
                        gen=combo(
                            (
                                "Apex",
                                "Vertex",
                                "Summit",
                                "Nimbus",
                                "Orion",
                                "Pioneer",
                                "Zenith",
                                "Harbor",
                                "Titan",
                                "Evergreen",
                            ),
                            ("Energy", "Bank", "Motors", "Foods", "Telecom", "Insurance"),
                        )
                    ),
                    fk("team_id", "teams", "team", "teams"),
                    cat(
                        "industry",
                        "industry",
                        "industries",
                        ("Finance", "Automotive", "Food", "Telecom", "Energy", "Retail"),
                    ),
                    num("annual_amount", "annual amount", 50000, 5000000, 10000),
                ),
            ),
        ),
    ),
    Db(
        "restaurants",
        "dining guide: restaurants, chefs, dishes and reviews",
        (
            Table(
                "restaurants",
                "restaurant",
                "restaurants",
                40,
                (
                    name(
                        gen=combo(
                            ("Golden", "Blue", "Rustic", "Little", "Silver", "Green", "Old", "Red", "Happy", "Urban"),
                            (
                                "Spoon",
                                "Olive",
                                "Lantern",
                                "Table",
                                "Fork",
                                "Kitchen",
                                "Garden",
                                "Bistro",
                                "Oven",
                                "Pepper",
                            ),
                            template="The {}",
                        )
                    ),
                    cat(
                        "cuisine",
                        "cuisine",
                        "cuisines",
                        ("Italian", "Mexican", "Japanese", "Indian", "French", "Thai", "American", "Greek"),
                    ),
                    cat("city", "city", "cities", CITIES),
                    real("rating", "rating", 2.5, 5.0, 1),
                    num("price_level", "price level", 1, 4),
                ),
                quote=True,
            ),
            Table(
                "chefs",
                "chef",
                "chefs",
                50,
                (
                    name(gen=person),
                    fk("restaurant_id", "restaurants", "restaurant", "restaurants"),
                    cat(
                        "specialty", "specialty", "specialties", ("Pastry", "Grill", "Sauces", "Seafood", "Vegetarian")
                    ),
                    num("years_experience", "years of experience", 1, 40),
                ),
            ),
            Table(
                "dishes",
                "dish",
                "dishes",
                150,
                (
                    name(
                        gen=combo(
                            (
                                "Spicy",
                                "Grilled",
                                "Roasted",
                                "Crispy",
                                "Smoked",
                                "Creamy",
                                "Braised",
                                "Fresh",
                                "Sweet",
                                "Garlic",
                                "Lemon",
                                "Honey",
                                "Baked",
                                "Pan-fried",
                            ),
                            (
                                "Noodles",
                                "Salmon",
                                "Chicken",
                                "Tofu",
                                "Risotto",
                                "Tacos",
                                "Curry",
                                "Salad",
                                "Dumplings",
                                "Lamb",
                                "Pancakes",
                                "Shrimp",
                                "Soup",
                                "Pork",
                                "Eggplant",
                                "Mushrooms",
                            ),
                        )
                    ),
                    fk("restaurant_id", "restaurants", "restaurant", "restaurants"),
                    cat("category", "category", "categories", ("Starter", "Main", "Dessert", "Side")),
                    real("price", "price", 4, 45),
                    num("calories", "calories", 100, 1400, 10),
                ),
                quote=True,
            ),
            Table(
                "reviews",
                "review",
                "reviews",
                300,
                (
                    fk("restaurant_id", "restaurants", "restaurant", "restaurants"),
                    num("score", "score", 1, 5),
                    num("year", "year", 2018, 2024),
                    cat("visit_type", "visit type", "visit types", ("dine-in", "takeout", "delivery")),
                ),
            ),
        ),
    ),
    Db(
        "company",
        "company: departments, employees, projects and assignments",
        (
            Table(
                "departments",
                "department",
                "departments",
                10,
                (
                    name(
                        gen=(
                            "Engineering",
                            "Marketing",
                            "Sales",
                            "Finance",
                            "Human Resources",
                            "Legal",
                            "Operations",
                            "Research",
                            "Support",
                            "Design",
                        )
                    ),
                    cat("location", "location", "locations", CITIES[:5]),
                    num("budget", "budget", 100000, 5000000, 10000),
                ),
            ),
            Table(
                "employees",
                "employee",
                "employees",
                160,
                (
                    name(gen=person),
                    fk("department_id", "departments", "department", "departments"),
                    cat(
                        "job_title",
                        "job title",
                        "job titles",
                        ("Analyst", "Engineer", "Manager", "Specialist", "Coordinator", "Director"),
                    ),
                    num("salary", "salary", 35000, 200000, 500),
                    num("hire_year", "hire year", 2000, 2024),
                ),
            ),
            Table(
                "projects",
                "project",
                "projects",
                40,
                (
                    name(
                        gen=combo(
                            ("Blue", "Red", "Silent", "Rapid", "Bright", "Iron", "Swift", "Deep"),
                            ("Falcon", "Harbor", "Summit", "Comet", "Bridge", "Forest", "Signal", "Engine"),
                            template="Project {}",
                        )
                    ),
                    fk("department_id", "departments", "department", "departments"),
                    num("budget", "budget", 20000, 2000000, 1000),
                    cat("status", "status", "statuses", ("planned", "active", "completed", "on hold")),
                ),
                quote=True,
            ),
            Table(
                "assignments",
                "assignment",
                "assignments",
                250,
                (
                    fk("employee_id", "employees", "employee", "employees"),
                    fk("project_id", "projects", "project", "projects"),
                    num("hours", "number of hours", 5, 400),
                    cat("role", "role", "roles", ("Lead", "Contributor", "Reviewer")),
                ),
                bridge=True,
                link="assigned to",
                rlink="staffed by",
            ),
        ),
    ),
    Db(
        "cinema",
        "film industry: studios, directors, movies, actors and casting",
        (
            Table(
                "studios",
                "studio",
                "studios",
                12,
                (
                    name(
                        gen=(
                            "Silverlight Pictures",
                            "Northstar Films",
                            "Red Canyon Studios",
                            "Blue Harbor Films",
                            "Lighthouse Pictures",
                            "Paper Moon Studios",
                            "Golden Gate Films",
                            "Evergreen Pictures",
                            "Ironbridge Studios",
                            "Starfall Films",
                            "Crescent Pictures",
                            "Maple Leaf Studios",
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    num("founded_year", "founding year", 1910, 2010),
                ),
            ),
            Table(
                "directors",
                "director",
                "directors",
                30,
                (
                    name(gen=person),
                    cat("nationality", "nationality", "nationalities", COUNTRIES),
                    num("birth_year", "birth year", 1940, 1990),
                ),
            ),
            Table(
                "movies",
                "movie",
                "movies",
                120,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Dark",
                                "Lost",
                                "Eternal",
                                "Savage",
                                "Frozen",
                                "Electric",
                                "Fallen",
                                "Silent",
                                "Crimson",
                                "Endless",
                                "Hidden",
                                "Brave",
                            ),
                            (
                                "Horizon",
                                "Empire",
                                "Storm",
                                "Echo",
                                "Frontier",
                                "Legacy",
                                "Signal",
                                "Tide",
                                "Paradise",
                                "Journey",
                                "Harvest",
                                "Crown",
                            ),
                        ),
                    ),
                    fk("studio_id", "studios", "studio", "studios"),
                    fk("director_id", "directors", "director", "directors"),
                    cat(
                        "genre",
                        "genre",
                        "genres",
                        ("Drama", "Comedy", "Action", "Horror", "Romance", "Documentary", "Animation"),
                    ),
                    num("release_year", "release year", 1980, 2024),
                    real("budget_millions", "budget in millions", 1, 250, 1),
                    real("rating", "rating", 1.0, 9.9, 1),
                ),
                quote=True,
            ),
            Table(
                "actors",
                "actor",
                "actors",
                80,
                (
                    name(gen=person),
                    cat("gender", "gender", "genders", ("female", "male")),
                    num("birth_year", "birth year", 1940, 2005),
                ),
            ),
            Table(
                "casting",
                "casting credit",
                "casting credits",
                250,
                (
                    fk("actor_id", "actors", "actor", "actors"),
                    fk("movie_id", "movies", "movie", "movies"),
                    cat("role_type", "role type", "role types", ("lead", "supporting", "cameo")),
                ),
                bridge=True,
                link="who appeared in",
                rlink="that feature",
            ),
        ),
    ),
)


# ---------------------------------------------------------------------------
# Schema conventions: what a database's names look like
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Style:
    """The naming and key conventions one database is written in, so no single house style is learned.

    ``case``: ``snake`` (``hire_year``), ``camel`` (``hireYear``), ``pascal`` (``HireYear``), ``upper``
    (``HIRE_YEAR``) or ``spaced`` (``"hire year"``, a quoted name every query must quote), for tables and columns.
    ``tables``: ``plural`` (``departments``) or ``singular`` (``department``; a singular that is an SQL keyword, like
    ``order``, stays plural). ``abbreviate``: common words of column names shortened (``dept``,
    ``yr``, ``qty``). ``key``: the key column is ``id``, ``<table>_id`` or ``<table>_no`` in the case of the style
    (bridge tables keep their composite key of two foreign keys). ``fk``: a foreign key column is named
    ``<thing>_id``, ``<thing>_ref``, ``fk_<thing>`` or just ``<thing>``. ``extras``: how many distractor columns (no
    question asks about them) each table gets, which varies the size of the schema. ``types``: the DDL's type names,
    ``sqlite`` (INTEGER, TEXT, REAL) or ``ansi`` (INT, VARCHAR(80), FLOAT). ``fk_clause``: foreign keys declared
    ``inline`` on the column or as ``constraints`` at the end of the CREATE TABLE. ``affix``: table names carry a
    prefix (``tbl``: ``tblCustomer``; ``t``: ``t_customer``) or a suffix (``data``: ``customer_data``), or none.
    ``synonyms``: the words of names are replaced by another word for the same thing where ``SYNONYMS`` has one
    (``clients`` for customers, ``town`` for city). ``legacy``: every word of a name is squeezed to at most four
    letters, its first and then its consonants (``cstm_nm``). The last three make names that cannot be guessed
    from a question's words: only reading the schema finds them.
    """

    case: str = "snake"
    tables: str = "plural"
    abbreviate: bool = False
    key: str = "id"
    extras: int = 0
    fk: str = "id"
    types: str = "sqlite"
    fk_clause: str = "inline"
    affix: str = ""
    synonyms: bool = False
    legacy: bool = False

    def describe(self) -> str:
        """Short text for DATASET.md."""
        keys = {"id": "id", "table_id": "<table>_id", "table_no": "<table>_no"}
        fks = {"id": "<x>_id", "ref": "<x>_ref", "prefix": "fk_<x>", "bare": "<x>"}
        parts = [self.case, self.tables, f"key {keys[self.key]}", f"fk {fks[self.fk]}"]
        if self.abbreviate:
            parts.append("abbreviated")
        parts.append(f"{self.extras} extra column(s) per table")
        if self.types != "sqlite":
            parts.append(f"{self.types} types")
        if self.fk_clause != "inline":
            parts.append("FOREIGN KEY constraints")
        if self.affix:
            parts.append({"tbl": "tables tbl<x>", "t": "tables t_<x>", "data": "tables <x>_data"}[self.affix])
        if self.synonyms:
            parts.append("synonyms")
        if self.legacy:
            parts.append("legacy squeezed words")
        return ", ".join(parts)


#: The values each dimension of ``Style`` can take; ``draw_style`` picks one of each.
STYLE_CHOICES: dict[str, tuple[Any, ...]] = {
    "case": ("snake", "camel", "pascal", "upper", "spaced"),
    "tables": ("plural", "singular"),
    "abbreviate": (False, True),
    "key": ("id", "table_id", "table_no"),
    "extras": (0, 1, 2, 3),
    "fk": ("id", "ref", "prefix", "bare"),
    "types": ("sqlite", "ansi"),
    "fk_clause": ("inline", "constraints"),
    "affix": ("", "tbl", "t", "data"),
    "synonyms": (False, True),
    "legacy": (False, False, True),
}


#: Each hand-styled generated database's conventions (the first ten domains; the other training databases draw
#: theirs with ``draw_style``).
STYLE_OF_DB: dict[str, Style] = {
    "school": Style(),
    "hospital": Style("pascal", "singular", True, "table_id", 2),
    "airline": Style("camel", "plural", False, "table_id", 1),
    "shop": Style("snake", "singular", True, "table_id", 1),
    "music": Style("pascal", "plural", False, "id", 2),
    "cinema": Style("camel", "singular", True, "id", 1),
    "company": Style("snake", "singular", False, "table_id", 1),
    "restaurants": Style("camel", "plural", True, "id", 0),
    "library": Style("pascal", "singular", False, "table_id", 1),
    "sports": Style("snake", "plural", True, "id", 2),
}
ABBREVIATIONS: dict[str, str] = {
    "department": "dept",
    "number": "num",
    "year": "yr",
    "years": "yrs",
    "quantity": "qty",
    "experience": "exp",
    "capacity": "cap",
    "amount": "amt",
    "salary": "sal",
    "millions": "mn",
    "publication": "pub",
    "membership": "mbr",
    "attendance": "attend",
    "destination": "dest",
    "elevation": "elev",
    "nationality": "natl",
    "specialty": "spec",
    "location": "loc",
    "instructor": "instr",
    "restaurant": "rest",
    "director": "dir",
    "customer": "cust",
    "product": "prod",
    "employee": "emp",
    "category": "categ",
    "shipping": "ship",
    "hours": "hrs",
}
#: Another word for the same thing, for ``Style.synonyms``: what a schema written by someone else calls it.
SYNONYMS: dict[str, str] = {
    "customer": "client",
    "customers": "clients",
    "employee": "staffer",
    "employees": "staff",
    "student": "pupil",
    "students": "pupils",
    "instructor": "teacher",
    "instructors": "teachers",
    "course": "module",
    "courses": "modules",
    "doctor": "physician",
    "doctors": "physicians",
    "patient": "case",
    "patients": "cases",
    "movie": "film",
    "movies": "films",
    "supplier": "vendor",
    "suppliers": "vendors",
    "shipment": "consignment",
    "shipments": "consignments",
    "car": "vehicle",
    "cars": "vehicles",
    "rental": "hire",
    "rentals": "hires",
    "property": "listing",
    "properties": "listings",
    "buyer": "purchaser",
    "buyers": "purchasers",
    "offer": "bid",
    "offers": "bids",
    "attendee": "participant",
    "attendees": "participants",
    "artwork": "piece",
    "artworks": "pieces",
    "farm": "holding",
    "farms": "holdings",
    "field": "plot",
    "fields": "plots",
    "harvest": "yield",
    "harvests": "yields",
    "guest": "visitor",
    "guests": "visitors",
    "developer": "engineer",
    "developers": "engineers",
    "commit": "changeset",
    "commits": "changesets",
    "candidate": "nominee",
    "candidates": "nominees",
    "mission": "expedition",
    "missions": "expeditions",
    "parcel": "package",
    "parcels": "packages",
    "donor": "benefactor",
    "donors": "benefactors",
    "donation": "gift",
    "donations": "gifts",
    "medicine": "drug",
    "medicines": "drugs",
    "book": "volume",
    "books": "volumes",
    "loan": "checkout",
    "loans": "checkouts",
    "author": "writer",
    "authors": "writers",
    "team": "squad",
    "teams": "squads",
    "player": "athlete",
    "players": "athletes",
    "venue": "location",
    "venues": "locations",
    "department": "division",
    "departments": "divisions",
    "branch": "outlet",
    "branches": "outlets",
    "agency": "bureau",
    "agencies": "bureaus",
    "restaurant": "eatery",
    "restaurants": "eateries",
    "dish": "plate",
    "dishes": "plates",
    "project": "initiative",
    "projects": "initiatives",
    "concert": "gig",
    "concerts": "gigs",
    "album": "record",
    "albums": "records",
    "product": "article",
    "products": "articles",
    "order": "purchase",
    "orders": "purchases",
    "member": "subscriber",
    "members": "subscribers",
    "hotel": "inn",
    "hotels": "inns",
    "flight": "trip",
    "flights": "trips",
    "name": "label",
    "city": "town",
    "country": "nation",
    "price": "tariff",
    "salary": "pay",
    "title": "heading",
    "status": "state",
    "budget": "funds",
    "duration": "length",
    "category": "kind",
    "genre": "style",
    "opened": "inaugurated",
    "founded": "established",
    "birth": "born",
    "rating": "stars",
    "weight": "mass",
}
#: SQL keywords a singular table name must not become.
SQL_KEYWORDS = frozenset({"order", "group", "case", "check", "index", "key", "limit", "table", "transaction", "values"})
#: Distractor columns: (snake-case name, values). Realistic clutter a real schema carries.
EXTRA_COLUMNS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("created_at", tuple(f"20{y:02d}-{m:02d}-{d:02d}" for y in (19, 21, 23) for m in (1, 4, 7, 10) for d in (3, 17))),
    ("is_archived", (0, 0, 0, 1)),
    ("notes", ("", "checked", "see file", "pending review", "n/a")),
    ("external_ref", tuple(f"EXT-{i:04d}" for i in range(3, 400, 7))),
    ("updated_by", ("admin", "system", "import", "ops")),
)


def _ident(words: Sequence[str], case: str) -> str:
    if case == "snake":
        return "_".join(words)
    if case == "upper":
        return "_".join(words).upper()
    if case == "spaced":
        return '"' + " ".join(words) + '"'
    if case == "camel":
        return words[0] + "".join(w.capitalize() for w in words[1:])
    if case == "pascal":
        return "".join(w.capitalize() for w in words)
    raise ValueError(f"case: {case!r}")


def _squeeze(word: str) -> str:
    """A legacy schema's word: its first letter and then its consonants, at most four letters (``cstm``)."""
    if len(word) <= 3:
        return word
    return (word[0] + "".join(ch for ch in word[1:] if ch not in "aeiou"))[:4]


def _words(words: Sequence[str], style: Style, abbreviate: bool = True) -> list[str]:
    """``words`` of a name as ``style`` writes them: synonyms, abbreviations (column names only: ``abbreviate``),
    legacy squeezing, in that order."""
    out = list(words)
    if style.synonyms:
        out = [SYNONYMS.get(w, w) for w in out]
    if style.abbreviate and abbreviate:
        out = [ABBREVIATIONS.get(w, w) for w in out]
    if style.legacy:
        out = [_squeeze(w) for w in out]
    return out


def _column_name(name_: str, style: Style) -> str:
    return _ident(_words(name_.split("_"), style), style.case)


def _fk_name(name_: str, style: Style) -> str:
    """A foreign key column (``<thing>_id`` in the spec) named as ``style.fk`` says."""
    thing = name_.removesuffix("_id")
    words = {"id": [thing, "id"], "ref": [thing, "ref"], "prefix": ["fk", thing], "bare": [thing]}[style.fk]
    column = _column_name("_".join(words), style)
    if column.lower() in SQL_KEYWORDS:
        raise ValueError(f"style {style} names a foreign key {column!r}, an SQL keyword")
    return column


def _table_name(table: Table, style: Style) -> str:
    words = table.name.split("_")
    if style.tables == "singular" and table.singular.split()[-1] not in SQL_KEYWORDS:
        words = table.singular.split()
    words = _words(words, style, abbreviate=False)
    if words[-1] in SQL_KEYWORDS:
        raise ValueError(f"style {style} names a table {words!r}, an SQL keyword")
    affixed = {"": words, "tbl": ["tbl", *words], "t": ["t", *words], "data": [*words, "data"]}[style.affix]
    return _ident(affixed, style.case)


@dataclass(frozen=True)
class Generated:
    """A generated database as it is built: the styled spec, its split, its style and the domains it was made from."""

    db: Db
    split: str
    style: Style
    sources: tuple[str, ...]


#: Training databases that join two training domains' tables in one schema (7-14 tables, the two parts unlinked).
MERGED_DATABASES = 12
#: Every ``TRIM_EVERY``-th extra domain keeps only its first three tables (a prefix of the creation order keeps every
#: foreign key), so small schemas are trained on too.
TRIM_EVERY = 4


def independent_table_names() -> frozenset[str]:
    """The table names of the hand-written databases (case-folded, unquoted), which no generated table may take."""
    names = set()
    for sql_file in INDEPENDENT_DIR.glob("*.sql"):
        for quoted, bare in re.findall(r'CREATE TABLE (?:"([^"]+)"|(\w+))', sql_file.read_text(encoding="utf-8")):
            names.add((quoted or bare).casefold())
    return frozenset(names)


def draw_style(db: Db) -> tuple[Db, Style]:
    """``db`` in a style drawn (seeded by its id) from ``STYLE_CHOICES``; draws again when a style would give two
    columns or two tables one name, a name an SQL keyword's, or a table the name of a hand-written database's."""
    rng = random.Random(f"{SEED}-{db.db_id}-style")
    taken = independent_table_names()
    for _ in range(50):
        style = Style(**{dimension: rng.choice(values) for dimension, values in STYLE_CHOICES.items()})
        try:
            restyled = styled(db, style)
        except ValueError:
            continue
        if not {t.name.strip('"').casefold() for t in restyled.tables} & taken:
            return restyled, style
    raise ValueError(f"{db.db_id}: no drawn style fits")


def merged(a: Db, b: Db) -> Db | None:
    """One database holding the tables of ``a`` and then ``b`` (None when a table name occurs in both)."""
    if {t.name for t in a.tables} & {t.name for t in b.tables}:
        return None
    topic = f"{a.description.split(':')[0]} and {b.description.split(':')[0]}"
    listed = ", ".join(t.plural for t in (*a.tables, *b.tables))
    return Db(f"{a.db_id}_{b.db_id}", f"{topic}: {listed}", a.tables + b.tables)


def extra_domains() -> tuple[Db, ...]:
    """The training-only domains of ``domains.py`` (imported here: that module builds on this one's spec types)."""
    from examples.sql_agent.domains import EXTRA_DOMAINS

    return EXTRA_DOMAINS


def generated_databases() -> list[Generated]:
    """Every generated database in build order: the ten hand-styled domains (train, dev and test, ``SPLIT_OF_DB``);
    then training databases only: each extra domain (``domains.EXTRA_DOMAINS``; every ``TRIM_EVERY``-th cut to three
    tables) and ``MERGED_DATABASES`` pairs of training domains, each in a drawn style. Dev and test domains never
    enter a training database."""
    out = [
        Generated(styled(db, STYLE_OF_DB[db.db_id]), SPLIT_OF_DB[db.db_id], STYLE_OF_DB[db.db_id], (db.db_id,))
        for db in DATABASES
    ]
    for i, domain in enumerate(extra_domains()):
        db = domain
        if i % TRIM_EVERY == TRIM_EVERY - 1 and len(domain.tables) > 3:
            db = replace(domain, tables=domain.tables[:3], description=f"{domain.description} (first three tables)")
        db, style = draw_style(db)
        out.append(Generated(db, "train", style, (domain.db_id,)))
    train_domains = [db for db in DATABASES if SPLIT_OF_DB[db.db_id] == "train"] + list(extra_domains())
    rng = random.Random(f"{SEED}-merges")
    pairs: set[tuple[str, str]] = set()
    while len(pairs) < MERGED_DATABASES:
        a, b = rng.sample(train_domains, 2)
        joined = merged(a, b)
        if joined is None or (a.db_id, b.db_id) in pairs or (b.db_id, a.db_id) in pairs:
            continue
        pairs.add((a.db_id, b.db_id))
        db, style = draw_style(joined)
        out.append(Generated(db, "train", style, (a.db_id, b.db_id)))
    return out


def styled(db: Db, style: Style) -> Db:
    """``db`` written in ``style``: tables, columns and keys renamed, distractor columns added. The questions'
    wording (phrases, plurals, roles) is unchanged: people do not talk in schema names."""
    names = {t.name: _table_name(t, style) for t in db.tables}
    suffix = {"id": "", "table_id": "id", "table_no": "no"}[style.key]
    keys = {
        t.name: "id"
        if not suffix
        else _ident([*_words(t.singular.split(), style, abbreviate=False), suffix], style.case)
        for t in db.tables
        if not t.bridge
    }
    if len({n.casefold() for n in names.values()}) != len(names):
        raise ValueError(f"{db.db_id}: style {style} gives two tables one name {sorted(names.values())}")
    tables = []
    for i, t in enumerate(db.tables):
        cols = []
        for c in t.cols:
            if c.kind == "fk":
                cols.append(replace(c, name=_fk_name(c.name, style), ref=names[c.ref], ref_key=keys[c.ref]))
            else:
                cols.append(replace(c, name=_column_name(c.name, style)))
        for j in range(style.extras):
            extra, values = EXTRA_COLUMNS[(i + j) % len(EXTRA_COLUMNS)]
            cols.append(Col(_ident(extra.split("_"), style.case), "extra", values=values))
        table = replace(
            t,
            name=names[t.name],
            cols=tuple(cols),
            pk=keys.get(t.name, "id"),
            types=style.types,
            fk_clause=style.fk_clause,
        )
        column_names = [name_.lower() for name_ in (table.pk, *(c.name for c in table.cols))]
        if len(set(column_names)) != len(column_names):
            raise ValueError(f"{db.db_id}.{table.name}: style {style} gives duplicate column names {column_names}")
        tables.append(table)
    return replace(db, tables=tuple(tables))


# ---------------------------------------------------------------------------
# Data generation
# ---------------------------------------------------------------------------


def _unique_names(rng: random.Random, gen: NameGen | tuple[str, ...], count: int) -> list[str]:
    if isinstance(gen, tuple):
        if count > len(gen):
            raise ValueError(f"need {count} names but the list has {len(gen)}")
        return rng.sample(gen, count)
    seen: list[str] = []
    tries = 0
    while len(seen) < count:
        candidate = gen(rng)
        tries += 1
        if candidate not in seen:
            seen.append(candidate)
        if tries > count * 200:
            raise ValueError(f"name generator cannot produce {count} unique names")
    return seen


def _popular_ids(rng: random.Random, ids: list[int]) -> tuple[list[int], list[float]]:
    """Referenced ids with skewed weights; about 12% of ids are never referenced.

    Unreferenced rows make "which X have no Y" questions answerable, and the
    skew makes group counts differ so "the most" questions have one answer.
    """
    keep = [i for i in ids if rng.random() > 0.12] or ids[:1]
    weights = [rng.choice((1.0, 1.0, 2.0, 3.0, 5.0)) for _ in keep]
    return keep, weights


def _value(rng: random.Random, col: Col) -> Any:
    if col.kind == "extra":
        return rng.choice(col.values)
    if col.kind == "cat":
        # Decreasing weights so categories have different frequencies.
        weights = [1.0 + 0.35 * (len(col.values) - i) for i in range(len(col.values))]
        return rng.choices(col.values, weights=weights)[0]
    if col.kind == "int":
        lo, hi = int(col.lo) // col.step, int(col.hi) // col.step
        return rng.randint(lo, hi) * col.step
    if col.kind == "real":
        return round(rng.uniform(col.lo, col.hi), col.decimals)
    raise ValueError(col.kind)


def populate(db: Db, conn: sqlite3.Connection, rng: random.Random) -> None:
    """Create the tables of ``db`` and fill them with deterministic pseudo-random rows."""
    ids: dict[str, list[int]] = {}
    for table in db.tables:
        conn.execute(table.ddl())
        fk_pools = {c.name: _popular_ids(rng, ids[c.ref]) for c in table.fks}
        name_col = table.name_col
        names = _unique_names(rng, name_col.gen, table.rows) if name_col and name_col.gen else []
        rows: list[tuple[Any, ...]] = []
        seen_pairs: set[tuple[Any, ...]] = set()
        attempts = 0
        while len(rows) < table.rows:
            attempts += 1
            if attempts > table.rows * 50:
                raise ValueError(f"cannot fill {db.db_id}.{table.name}")
            values: list[Any] = []
            for col in table.cols:
                if col.kind == "name":
                    values.append(names[len(rows)])
                elif col.kind == "fk":
                    pool, weights = fk_pools[col.name]
                    values.append(rng.choices(pool, weights=weights)[0])
                else:
                    values.append(_value(rng, col))
            if table.bridge:
                pair = tuple(v for v, c in zip(values, table.cols, strict=True) if c.kind == "fk")
                if pair in seen_pairs:
                    continue
                seen_pairs.add(pair)
                rows.append(tuple(values))
            else:
                rows.append((len(rows) + 1, *values))
        columns = ([] if table.bridge else [table.pk]) + [c.name for c in table.cols]
        marks = ", ".join("?" for _ in columns)
        conn.executemany(f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({marks})", rows)
        ids[table.name] = list(range(1, table.rows + 1))
    conn.commit()


# ---------------------------------------------------------------------------
# Question templates
# ---------------------------------------------------------------------------


def lit(value: Any) -> str:
    """SQL literal for a value taken from the data."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value) if isinstance(value, float) else str(value)


def fmt(value: Any) -> str:
    """A number or text as it appears in a question."""
    return repr(value) if isinstance(value, float) else str(value)


GT = ("greater than", "more than", "above")
LT = ("less than", "below", "lower than")


@dataclass
class Ctx:
    """What a template needs: the database spec, a connection and the seeded rng."""

    db: Db
    conn: sqlite3.Connection
    rng: random.Random
    _cache: dict[str, list[Any]] = field(default_factory=dict)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql).fetchall()

    def column(self, sql: str) -> list[Any]:
        if sql not in self._cache:
            self._cache[sql] = [r[0] for r in self.query(sql) if r[0] is not None]
        return self._cache[sql]

    def pick(self, options: Sequence[Any]) -> Any:
        return self.rng.choice(list(options))

    def tables(self, pred: Callable[[Table], bool]) -> Table | None:
        candidates = [t for t in self.db.tables if pred(t)]
        return self.rng.choice(candidates) if candidates else None

    def value(self, table: Table, col: Col) -> Any:
        """A value of ``col`` that occurs in the data."""
        return self.pick(self.column(f"SELECT DISTINCT {col.name} FROM {table.name} ORDER BY 1"))

    def threshold(self, table: Table, col: Col) -> Any:
        """A value of numeric ``col`` from the middle of its distribution."""
        values = self.column(f"SELECT DISTINCT {col.name} FROM {table.name} ORDER BY 1")
        n = len(values)
        return values[self.rng.randint(n // 5, max(n // 5, (4 * n) // 5 - 1))]

    def relations(self) -> list[tuple[Table, Col, Table]]:
        """All (child table, fk column, parent table) triples."""
        return [(t, c, self.db.table(c.ref)) for t in self.db.tables for c in t.fks]

    def relation(self, pred: Callable[[Table, Col, Table], bool]) -> tuple[Table, Col, Table] | None:
        candidates = [r for r in self.relations() if pred(*r)]
        return self.rng.choice(candidates) if candidates else None

    def distinct_top(self, sql: str, k: int) -> bool:
        """True when the first ``k`` + 1 sort keys returned by ``sql`` are all different."""
        keys = [r[0] for r in self.query(sql)][: k + 1]
        return len(set(keys)) == len(keys)


Candidate = tuple[str, str]
Template = Callable[[Ctx], Candidate | None]


def ent(table: Table, value: str) -> str:
    """A row name inside a question (titles are quoted)."""
    return f'"{value}"' if table.quote else value


def has_name(t: Table) -> bool:
    return t.name_col is not None


# --- easy: one table --------------------------------------------------------


def e_count_all(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: True)
    assert t is not None
    q = c.pick(("How many {P} are there?", "Count the number of {P}.", "What is the total number of {P}?")).format(
        P=t.plural
    )
    return q, f"SELECT COUNT(*) FROM {t.name}"


def e_count_cat(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.cats))
    if t is None:
        return None
    col = c.pick(t.cats)
    v = c.value(t, col)
    q = c.pick(
        ("How many {P} have {c} {v}?", "Count the {P} whose {c} is {v}.", "What is the number of {P} with {c} {v}?")
    ).format(P=t.plural, c=col.phrase, v=v)
    return q, f"SELECT COUNT(*) FROM {t.name} WHERE {col.name} = {lit(v)}"


def e_names_cat(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.cats))
    if t is None or t.name_col is None:
        return None
    col, nc = c.pick(t.cats), t.name_col
    v = c.value(t, col)
    q = c.pick(
        (
            "List the {N} of {P} whose {c} is {v}.",
            "Which {P} have {c} {v}? Give their {N}.",
            "Show the {N} of all {P} with {c} {v}.",
        )
    ).format(N=nc.plural, P=t.plural, c=col.phrase, v=v)
    return q, f"SELECT {nc.name} FROM {t.name} WHERE {col.name} = {lit(v)}"


def e_names_num(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.nums))
    if t is None or t.name_col is None:
        return None
    col, nc = c.pick(t.nums), t.name_col
    x = c.threshold(t, col)
    op, words = c.pick(((">", GT), ("<", LT)))
    q = c.pick(
        (
            "List the {N} of {P} whose {n} is {w} {x}.",
            "Which {P} have a {n} {w} {x}? Give their {N}.",
            "Show the {N} of {P} with {n} {w} {x}.",
        )
    ).format(N=nc.plural, P=t.plural, n=col.phrase, w=c.pick(words), x=fmt(x))
    return q, f"SELECT {nc.name} FROM {t.name} WHERE {col.name} {op} {lit(x)}"


def e_count_num(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.nums))
    if t is None:
        return None
    col = c.pick(t.nums)
    x = c.threshold(t, col)
    op, words = c.pick(((">", GT), ("<", LT)))
    q = c.pick(("How many {P} have a {n} {w} {x}?", "Count the {P} whose {n} is {w} {x}.")).format(
        P=t.plural, n=col.phrase, w=c.pick(words), x=fmt(x)
    )
    return q, f"SELECT COUNT(*) FROM {t.name} WHERE {col.name} {op} {lit(x)}"


def e_lookup(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.cats or t.nums))
    if t is None or t.name_col is None:
        return None
    col, nc = c.pick(t.cats + t.nums), t.name_col
    e = c.value(t, nc)
    q = c.pick(("What is the {a} of the {S} {E}?", "Find the {a} of {S} {E}.", "Give the {a} of the {S} {E}.")).format(
        a=col.phrase, S=t.singular, E=ent(t, e)
    )
    return q, f"SELECT {col.name} FROM {t.name} WHERE {nc.name} = {lit(e)}"


def e_lookup_two(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and len(t.cats + t.nums) >= 2)
    if t is None or t.name_col is None:
        return None
    a, b = c.rng.sample(t.cats + t.nums, 2)
    e = c.value(t, t.name_col)
    q = c.pick(("What are the {a} and {b} of the {S} {E}?", "Show the {a} and the {b} of {S} {E}.")).format(
        a=a.phrase, b=b.phrase, S=t.singular, E=ent(t, e)
    )
    return q, f"SELECT {a.name}, {b.name} FROM {t.name} WHERE {t.name_col.name} = {lit(e)}"


def e_agg(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.nums))
    if t is None:
        return None
    col = c.pick(t.nums)
    fn, phrasings = c.pick(
        (
            ("MAX", ("What is the highest {n} among all {P}?", "What is the maximum {n} of {P}?")),
            ("MIN", ("What is the lowest {n} among all {P}?", "What is the minimum {n} of {P}?")),
            ("AVG", ("What is the average {n} of all {P}?", "Compute the average {n} across {P}.")),
        )
    )
    q = c.pick(phrasings).format(n=col.phrase, P=t.plural)
    return q, f"SELECT {fn}({col.name}) FROM {t.name}"


def e_distinct(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.cats))
    if t is None:
        return None
    col = c.pick(t.cats)
    q = c.pick(
        (
            "What are the distinct {cp} of {P}?",
            "List all different {cp} of {P}.",
            "Show each {c} that appears among the {P}, without duplicates.",
        )
    ).format(cp=col.plural, c=col.phrase, P=t.plural)
    return q, f"SELECT DISTINCT {col.name} FROM {t.name}"


def e_list_all(c: Ctx) -> Candidate | None:
    t = c.tables(has_name)
    if t is None or t.name_col is None:
        return None
    q = c.pick(("List the {N} of all {P}.", "What are the {N} of all {P}?")).format(N=t.name_col.plural, P=t.plural)
    return q, f"SELECT {t.name_col.name} FROM {t.name}"


# --- medium: one table, compound conditions, ordering, grouping ---------------


def m_and(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.cats) and bool(t.nums))
    if t is None or t.name_col is None:
        return None
    cc, nc_, nm = c.pick(t.cats), c.pick(t.nums), t.name_col
    v, x = c.value(t, cc), c.threshold(t, nc_)
    op, words = c.pick(((">", GT), ("<", LT)))
    q = c.pick(
        (
            "List the {N} of {P} whose {c} is {v} and whose {n} is {w} {x}.",
            "Which {P} have {c} {v} and a {n} {w} {x}? Give their {N}.",
        )
    ).format(N=nm.plural, P=t.plural, c=cc.phrase, v=v, n=nc_.phrase, w=c.pick(words), x=fmt(x))
    return q, (f"SELECT {nm.name} FROM {t.name} WHERE {cc.name} = {lit(v)} AND {nc_.name} {op} {lit(x)}")


def m_count_and(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.cats) and bool(t.nums))
    if t is None:
        return None
    cc, nc_ = c.pick(t.cats), c.pick(t.nums)
    v, x = c.value(t, cc), c.threshold(t, nc_)
    q = c.pick(
        ("How many {P} have {c} {v} and a {n} {w} {x}?", "Count the {P} whose {c} is {v} and whose {n} is {w} {x}.")
    ).format(P=t.plural, c=cc.phrase, v=v, n=nc_.phrase, w=c.pick(GT), x=fmt(x))
    return q, f"SELECT COUNT(*) FROM {t.name} WHERE {cc.name} = {lit(v)} AND {nc_.name} > {lit(x)}"


def m_or(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: any(len(col.values) >= 3 for col in t.cats))
    if t is None:
        return None
    col = c.pick([x for x in t.cats if len(x.values) >= 3])
    values = c.column(f"SELECT DISTINCT {col.name} FROM {t.name} ORDER BY 1")
    if len(values) < 3:
        return None
    v1, v2 = c.rng.sample(values, 2)
    where = f"{col.name} = {lit(v1)} OR {col.name} = {lit(v2)}"
    if t.name_col is not None and c.rng.random() < 0.5:
        q = c.pick(
            ("List the {N} of {P} whose {c} is {v1} or {v2}.", "Which {P} have {c} {v1} or {c} {v2}? Give their {N}.")
        ).format(N=t.name_col.plural, P=t.plural, c=col.phrase, v1=v1, v2=v2)
        return q, f"SELECT {t.name_col.name} FROM {t.name} WHERE {where}"
    q = c.pick(("How many {P} have {c} {v1} or {v2}?", "Count the {P} whose {c} is either {v1} or {v2}.")).format(
        P=t.plural, c=col.phrase, v1=v1, v2=v2
    )
    return q, f"SELECT COUNT(*) FROM {t.name} WHERE {where}"


def m_top1(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.nums))
    if t is None or t.name_col is None:
        return None
    col, nm = c.pick(t.nums), t.name_col
    order, phrasings = c.pick(
        (
            (
                "DESC",
                (
                    "Which {S} has the highest {n}?",
                    "What is the {nm} of the {S} with the largest {n}?",
                    "Find the {S} with the highest {n} and give its {nm}.",
                ),
            ),
            (
                "ASC",
                (
                    "Which {S} has the lowest {n}?",
                    "What is the {nm} of the {S} with the smallest {n}?",
                    "Find the {S} with the lowest {n} and give its {nm}.",
                ),
            ),
        )
    )
    if not c.distinct_top(f"SELECT {col.name} FROM {t.name} ORDER BY {col.name} {order}", 1):
        return None
    q = c.pick(phrasings).format(S=t.singular, n=col.phrase, nm=nm.phrase)
    return q, f"SELECT {nm.name} FROM {t.name} ORDER BY {col.name} {order} LIMIT 1"


def m_topk(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.nums))
    if t is None or t.name_col is None:
        return None
    col, nm, k = c.pick(t.nums), t.name_col, c.rng.randint(3, 5)
    order, word = c.pick((("DESC", "highest"), ("ASC", "lowest")))
    if not c.distinct_top(f"SELECT {col.name} FROM {t.name} ORDER BY {col.name} {order}", k):
        return None
    q = c.pick(
        ("List the {N} of the {k} {P} with the {w} {n}.", "Show the {N} of the top {k} {P} by {w} {n}, in order.")
    ).format(N=nm.plural, k=k, P=t.plural, w=word, n=col.phrase)
    return q, f"SELECT {nm.name} FROM {t.name} ORDER BY {col.name} {order} LIMIT {k}"


def m_group_count(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.cats))
    if t is None:
        return None
    col = c.pick(t.cats)
    q = c.pick(
        ("How many {P} are there for each {c}?", "Count the {P} in each {c}.", "For each {c}, show the number of {P}.")
    ).format(P=t.plural, c=col.phrase)
    return q, f"SELECT {col.name}, COUNT(*) FROM {t.name} GROUP BY {col.name}"


def m_group_agg(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.cats) and bool(t.nums))
    if t is None:
        return None
    cc, nc_ = c.pick(t.cats), c.pick(t.nums)
    fn, word = c.pick((("AVG", "average"), ("MAX", "highest"), ("MIN", "lowest")))
    q = c.pick(("What is the {w} {n} of {P} for each {c}?", "For each {c}, compute the {w} {n} of the {P}.")).format(
        w=word, n=nc_.phrase, P=t.plural, c=cc.phrase
    )
    return q, f"SELECT {cc.name}, {fn}({nc_.name}) FROM {t.name} GROUP BY {cc.name}"


def m_between(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.nums))
    if t is None or t.name_col is None:
        return None
    col, nm = c.pick(t.nums), t.name_col
    a, b = sorted((c.threshold(t, col), c.threshold(t, col)))
    if a == b:
        return None
    q = c.pick(
        (
            "List the {N} of {P} whose {n} is between {a} and {b}.",
            "Which {P} have a {n} between {a} and {b} (inclusive)? Give their {N}.",
        )
    ).format(N=nm.plural, P=t.plural, n=col.phrase, a=fmt(a), b=fmt(b))
    return q, f"SELECT {nm.name} FROM {t.name} WHERE {col.name} BETWEEN {lit(a)} AND {lit(b)}"


def m_most_common(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: bool(t.cats))
    if t is None:
        return None
    col = c.pick(t.cats)
    counts = f"SELECT COUNT(*) FROM {t.name} GROUP BY {col.name} ORDER BY COUNT(*) DESC"
    if not c.distinct_top(counts, 1):
        return None
    q = c.pick(
        (
            "Which {c} is the most common among {P}?",
            "What is the most frequent {c} of {P}?",
            "Which {c} do the most {P} have?",
        )
    ).format(c=col.phrase, P=t.plural)
    return q, (f"SELECT {col.name} FROM {t.name} GROUP BY {col.name} ORDER BY COUNT(*) DESC LIMIT 1")


def m_sorted_filter(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.cats) and bool(t.nums))
    if t is None or t.name_col is None:
        return None
    cc, nc_, nm = c.pick(t.cats), c.pick(t.nums), t.name_col
    v = c.value(t, cc)
    keys = c.column(f"SELECT {nc_.name} FROM {t.name} WHERE {cc.name} = {lit(v)}")
    if len(keys) < 2 or len(set(keys)) != len(keys) or len(keys) > 25:
        return None
    order, phrase = c.pick((("DESC", "from highest to lowest"), ("ASC", "from lowest to highest")))
    q = c.pick(
        (
            "List the {N} of {P} with {c} {v}, sorted by {n} {o}.",
            "Show the {N} of the {P} whose {c} is {v}, ordered by {n} {o}.",
        )
    ).format(N=nm.plural, P=t.plural, c=cc.phrase, v=v, n=nc_.phrase, o=phrase)
    return q, (f"SELECT {nm.name} FROM {t.name} WHERE {cc.name} = {lit(v)} ORDER BY {nc_.name} {order}")


# --- join: two tables ------------------------------------------------------------

JOIN = "FROM {ct} AS T1 JOIN {pt} AS T2 ON T1.{fk} = T2.{pk}"


def _join(child: Table, col: Col, parent: Table) -> str:
    return JOIN.format(ct=child.name, pt=parent.name, fk=col.name, pk=parent.pk)


def _parent_with_children(c: Ctx, child: Table, col: Col, parent: Table) -> str:
    assert parent.name_col is not None
    return str(c.pick(c.column(f"SELECT DISTINCT T2.{parent.name_col.name} {_join(child, col, parent)} ORDER BY 1")))


def j_child_names(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(ch) and has_name(p))
    if r is None:
        return None
    ch, col, p = r
    assert ch.name_col is not None and p.name_col is not None
    e = _parent_with_children(c, ch, col, p)
    q = c.pick(
        (
            "List the {N} of {P} whose {r} is {E}.",
            "Which {P} are associated with the {r} {E}? Give their {N}.",
            "Show the {N} of all {P} belonging to the {r} {E}.",
        )
    ).format(N=ch.name_col.plural, P=ch.plural, r=col.role, E=ent(p, e))
    return q, (f"SELECT T1.{ch.name_col.name} {_join(ch, col, p)} WHERE T2.{p.name_col.name} = {lit(e)}")


def j_count_children(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    e = _parent_with_children(c, ch, col, p)
    q = c.pick(
        (
            "How many {P} does the {r} {E} have?",
            "Count the {P} associated with the {r} {E}.",
            "What is the number of {P} whose {r} is {E}?",
        )
    ).format(P=ch.plural, r=col.role, E=ent(p, e))
    return q, f"SELECT COUNT(*) {_join(ch, col, p)} WHERE T2.{p.name_col.name} = {lit(e)}"


def j_parent_of_child(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(ch) and has_name(p))
    if r is None:
        return None
    ch, col, p = r
    assert ch.name_col is not None and p.name_col is not None
    e = c.value(ch, ch.name_col)
    q = c.pick(
        ("What is the {pn} of the {r} of the {S} {E}?", "Which {r} is the {S} {E} associated with? Give its {pn}.")
    ).format(pn=p.name_col.phrase, r=col.role, S=ch.singular, E=ent(ch, e))
    return q, (f"SELECT T2.{p.name_col.name} {_join(ch, col, p)} WHERE T1.{ch.name_col.name} = {lit(e)}")


def j_child_by_parent_attr(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(ch) and bool(p.cats or p.nums))
    if r is None:
        return None
    ch, col, p = r
    assert ch.name_col is not None
    pc = c.pick(p.cats + p.nums)
    if pc.kind == "cat":
        v = c.value(p, pc)
        cond, text = f"T2.{pc.name} = {lit(v)}", f"{pc.phrase} {v}"
    else:
        v = c.threshold(p, pc)
        cond, text = f"T2.{pc.name} > {lit(v)}", f"a {pc.phrase} {c.pick(GT)} {fmt(v)}"
    q = c.pick(
        ("List the {N} of {P} whose {r} has {t}.", "Which {P} belong to a {r} with {t}? Give their {N}.")
    ).format(N=ch.name_col.plural, P=ch.plural, r=col.role, t=text)
    return q, f"SELECT T1.{ch.name_col.name} {_join(ch, col, p)} WHERE {cond}"


def j_pairs(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(ch) and has_name(p) and bool(ch.nums))
    if r is None:
        return None
    ch, col, p = r
    assert ch.name_col is not None and p.name_col is not None
    nc_ = c.pick(ch.nums)
    x = c.threshold(ch, nc_)
    q = c.pick(
        (
            "For each {S} with a {n} {w} {x}, show its {cn} and the {pn} of its {r}.",
            "Show the {cn} of every {S} whose {n} is {w} {x}, together with the {pn} of its {r}.",
        )
    ).format(
        S=ch.singular, n=nc_.phrase, w=c.pick(GT), x=fmt(x), cn=ch.name_col.phrase, pn=p.name_col.phrase, r=col.role
    )
    return q, (f"SELECT T1.{ch.name_col.name}, T2.{p.name_col.name} {_join(ch, col, p)} WHERE T1.{nc_.name} > {lit(x)}")


def j_agg_by_parent(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p) and bool(ch.nums))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    nc_ = c.pick(ch.nums)
    e = _parent_with_children(c, ch, col, p)
    fn, word = c.pick((("AVG", "average"), ("MAX", "highest"), ("MIN", "lowest")))
    q = c.pick(
        (
            "What is the {w} {n} of the {P} whose {r} is {E}?",
            "Compute the {w} {n} of the {P} associated with the {r} {E}.",
        )
    ).format(w=word, n=nc_.phrase, P=ch.plural, r=col.role, E=ent(p, e))
    return q, (f"SELECT {fn}(T1.{nc_.name}) {_join(ch, col, p)} WHERE T2.{p.name_col.name} = {lit(e)}")


# --- hard: joins with grouping, nesting, three tables ---------------------------


def h_group_count(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    q = c.pick(
        (
            "For each {r} that has {P}, show its {pn} and the number of its {P}.",
            "How many {P} does each {r} have? List the {pn} of the {r} and the count, leaving out {rp} without {P}.",
        )
    ).format(r=col.role, rp=col.role_plural, P=ch.plural, pn=p.name_col.phrase)
    return q, (f"SELECT T2.{p.name_col.name}, COUNT(*) {_join(ch, col, p)} GROUP BY T2.{p.pk}")


def h_having_count(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    counts = sorted(set(c.column(f"SELECT COUNT(*) {_join(ch, col, p)} GROUP BY T2.{p.pk}")))
    if len(counts) < 3:
        return None
    n = counts[c.rng.randint(len(counts) // 3, len(counts) - 2)]
    q = c.pick(
        (
            "Which {rp} have more than {n} {P}? List their {pn}.",
            "Find the {pn} of the {rp} associated with more than {n} {P}.",
        )
    ).format(rp=col.role_plural, n=n, P=ch.plural, pn=p.name_col.plural)
    return q, (f"SELECT T2.{p.name_col.name} {_join(ch, col, p)} GROUP BY T2.{p.pk} HAVING COUNT(*) > {n}")


def h_most_children(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    if not c.distinct_top(f"SELECT COUNT(*) {_join(ch, col, p)} GROUP BY T2.{p.pk} ORDER BY COUNT(*) DESC", 1):
        return None
    q = c.pick(
        ("Which {r} has the most {P}? Give its {pn}.", "What is the {pn} of the {r} with the largest number of {P}?")
    ).format(r=col.role, P=ch.plural, pn=p.name_col.phrase)
    return q, (f"SELECT T2.{p.name_col.name} {_join(ch, col, p)} GROUP BY T2.{p.pk} ORDER BY COUNT(*) DESC LIMIT 1")


def h_above_avg(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: has_name(t) and bool(t.nums))
    if t is None or t.name_col is None:
        return None
    col = c.pick(t.nums)
    q = c.pick(
        (
            "List the {N} of {P} whose {n} is above the average {n} of all {P}.",
            "Which {P} have a {n} higher than the average? Give their {N}.",
        )
    ).format(N=t.name_col.plural, P=t.plural, n=col.phrase)
    return q, (f"SELECT {t.name_col.name} FROM {t.name} WHERE {col.name} > (SELECT AVG({col.name}) FROM {t.name})")


def h_not_in(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    q = c.pick(
        ("Which {pp} have no {P}? List their {pn}.", "Find the {pn} of {pp} that are not the {r} of any {S}.")
    ).format(pp=p.plural, P=ch.plural, pn=p.name_col.plural, r=col.role, S=ch.singular)
    return q, (f"SELECT {p.name_col.name} FROM {p.name} WHERE {p.pk} NOT IN (SELECT {col.name} FROM {ch.name})")


def h_having_avg(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p) and bool(ch.nums))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    nc_ = c.pick(ch.nums)
    avgs = sorted(c.column(f"SELECT AVG(T1.{nc_.name}) {_join(ch, col, p)} GROUP BY T2.{p.pk}"))
    if len(avgs) < 4:
        return None
    x = round(avgs[c.rng.randint(len(avgs) // 3, len(avgs) - 2)], 1)
    if isinstance(c.column(f"SELECT {nc_.name} FROM {ch.name} LIMIT 1")[0], int) and x.is_integer():
        x = int(x)
    q = c.pick(
        (
            "List the {pn} of the {rp} whose {P} have an average {n} greater than {x}.",
            "Which {rp} have an average {n} of their {P} above {x}? Give their {pn}.",
        )
    ).format(pn=p.name_col.plural, rp=col.role_plural, P=ch.plural, n=nc_.phrase, x=fmt(x))
    return q, (
        f"SELECT T2.{p.name_col.name} {_join(ch, col, p)} GROUP BY T2.{p.pk} HAVING AVG(T1.{nc_.name}) > {lit(x)}"
    )


def h_max_per_parent(c: Ctx) -> Candidate | None:
    r = c.relation(lambda ch, col, p: has_name(p) and bool(ch.nums))
    if r is None:
        return None
    ch, col, p = r
    assert p.name_col is not None
    nc_ = c.pick(ch.nums)
    fn, word = c.pick((("MAX", "highest"), ("AVG", "average"), ("SUM", "total")))
    q = c.pick(
        (
            "For each {r}, what is the {w} {n} of its {P}? Show the {pn} and that value.",
            "Show the {pn} of each {r} together with the {w} {n} of its {P}.",
        )
    ).format(r=col.role, w=word, n=nc_.phrase, P=ch.plural, pn=p.name_col.phrase)
    return q, (f"SELECT T2.{p.name_col.name}, {fn}(T1.{nc_.name}) {_join(ch, col, p)} GROUP BY T2.{p.pk}")


def h_bridge(c: Ctx) -> Candidate | None:
    t = c.tables(lambda t: t.bridge)
    if t is None:
        return None
    fa, fb = t.fks
    a, b = c.db.table(fa.ref), c.db.table(fb.ref)
    if c.rng.random() < 0.5:  # ask from the other side of the relation
        fa, fb, a, b = fb, fa, b, a
        link = t.rlink
    else:
        link = t.link
    assert a.name_col is not None and b.name_col is not None
    join = (
        f"FROM {a.name} AS T1 JOIN {t.name} AS T2 ON T1.{a.pk} = T2.{fa.name} "
        f"JOIN {b.name} AS T3 ON T2.{fb.name} = T3.{b.pk}"
    )
    e = c.pick(c.column(f"SELECT DISTINCT T3.{b.name_col.name} {join} ORDER BY 1"))
    q = c.pick(("List the {N} of {P} {link} the {bs} {E}.", "Which {P} {link2} the {bs} {E}? Give their {N}.")).format(
        N=a.name_col.plural,
        P=a.plural,
        link=link,
        bs=b.singular,
        E=ent(b, e),
        link2=link.removeprefix("who ").removeprefix("that ") if link.startswith(("who ", "that ")) else f"are {link}",
    )
    return q, (f"SELECT DISTINCT T1.{a.name_col.name} {join} WHERE T3.{b.name_col.name} = {lit(e)}")


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "easy": (
        e_count_all,
        e_count_cat,
        e_names_cat,
        e_names_num,
        e_count_num,
        e_lookup,
        e_lookup_two,
        e_agg,
        e_distinct,
        e_list_all,
    ),
    "medium": (
        m_and,
        m_count_and,
        m_or,
        m_top1,
        m_topk,
        m_group_count,
        m_group_agg,
        m_between,
        m_most_common,
        m_sorted_filter,
    ),
    "join": (j_child_names, j_count_children, j_parent_of_child, j_child_by_parent_attr, j_pairs, j_agg_by_parent),
    "hard": (
        h_group_count,
        h_having_count,
        h_most_children,
        h_above_avg,
        h_not_in,
        h_having_avg,
        h_max_per_parent,
        h_bridge,
    ),
}
ATTEMPTS_PER_TEMPLATE = 80


# ---------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------


#: Other ways to open a request, tried on the template's opening words (the rest of the question is kept).
OPENINGS: dict[str, tuple[str, ...]] = {
    "List the ": ("Give me the ", "Return the ", "I need the ", "Get the "),
    "Show the ": ("Display the ", "Can you show the ", "Print the "),
    "What is the ": ("Tell me the ", "Find the ", "I want to know the "),
    "What are the ": ("Tell me the ", "Look up the "),
    "How many ": ("Count how many ", "Find out how many "),
    "Which ": ("Tell me which ", "Find which "),
    "Count the ": ("Give the count of the ", "Return the number of the "),
}
#: Wrappers around a whole question: register and punctuation vary as they do in real requests.
WRAPPERS: tuple[str, ...] = ("Question: {q}", "{q} Answer from the database.", "Using the data, {lq}", "{lq_bare}")


def rephrase(question: str, rng: random.Random, wrap_unmatched: bool = False) -> str:
    """About half of the questions keep the template's words; the others get another opening (a request instead of
    a question ends with a full stop), or a wrapper (a label, a trailing instruction, a lowercase request without
    punctuation). Spreads the phrasing beyond the templates' 2-3 paraphrases. A question drawn for a new opening
    that starts with none of ``OPENINGS`` keeps its words, unless ``wrap_unmatched`` gives it a wrapper instead (the
    training-only databases do, so that at least half of their questions are rephrased; the first ten domains keep
    the questions they always had, so figures measured on them stay comparable)."""
    roll = rng.random()
    if roll < 0.5:
        return question
    if roll < 0.8:
        for start, options in OPENINGS.items():
            if question.startswith(start):
                text = rng.choice(options) + question[len(start) :]
                if not text.startswith(("Can you", "Which")) and text.endswith("?"):
                    text = text[:-1] + "."
                return text
        if not wrap_unmatched:
            return question
    lowered = question[0].lower() + question[1:]
    return rng.choice(WRAPPERS).format(q=question, lq=lowered, lq_bare=lowered.rstrip("?."))


def _usable(rows: list[tuple[Any, ...]]) -> bool:
    """Gold results must be non-empty, not all NULL and small enough to compare."""
    if not rows or len(rows) > MAX_RESULT_ROWS:
        return False
    return any(v is not None for row in rows for v in row)


def questions_for_db(
    db: Db, conn: sqlite3.Connection, rng: random.Random, wrap_unmatched: bool = False
) -> list[dict[str, Any]]:
    """Generate, validate and select the questions of one database.

    Each template is tried many times; valid candidates are deduplicated by SQL
    and by question text. Selection then cycles over the templates of a tier in
    shuffled order so that every question type is represented.
    """
    ctx = Ctx(db, conn, rng)
    chosen: list[dict[str, Any]] = []
    for tier, templates in TEMPLATES.items():
        pools: dict[str, list[tuple[str, str, int]]] = {}
        seen: set[str] = set()
        for template in templates:
            pool: list[tuple[str, str, int]] = []
            for _ in range(ATTEMPTS_PER_TEMPLATE):
                cand = template(ctx)
                if cand is None:
                    continue
                question, sql = cand
                if sql in seen or question in seen:
                    continue
                rows = conn.execute(sql).fetchall()
                if not _usable(rows):
                    continue
                seen.update((sql, question))
                pool.append((question, sql, len(rows)))
            if pool:
                pools[template.__name__] = pool
        names = sorted(pools)
        rng.shuffle(names)
        picked: list[dict[str, Any]] = []
        while len(picked) < TIER_QUOTA[tier] and any(pools[n] for n in names):
            for n in names:
                if pools[n] and len(picked) < TIER_QUOTA[tier]:
                    question, sql, nrows = pools[n].pop(rng.randrange(len(pools[n])))
                    picked.append({"question": question, "gold_sql": sql, "tier": tier, "template": n, "rows": nrows})
        if len(picked) < TIER_QUOTA[tier]:
            raise RuntimeError(f"{db.db_id}: only {len(picked)} {tier} questions")
        chosen.extend(picked)
    rng.shuffle(chosen)
    for item in chosen:
        phrased = rephrase(item["question"], rng, wrap_unmatched)
        item["rephrased"], item["question"] = phrased != item["question"], phrased
    for i, item in enumerate(chosen):
        item["id"] = f"{db.db_id}-{i}"
        item["db_id"] = db.db_id
    return chosen


def independent_databases(dbs_dir: Path) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, dict[str, Any]]]:
    """Build the hand-written databases of ``INDEPENDENT_DIR`` into ``dbs_dir`` and check their questions: every
    gold query must execute and give a usable result. Returns (questions, schemas, per-database statistics)."""
    schemas: dict[str, str] = {}
    db_stats: dict[str, dict[str, Any]] = {}
    conns: dict[str, sqlite3.Connection] = {}
    try:
        for sql_file in sorted(INDEPENDENT_DIR.glob("*.sql")):
            db_id, text = sql_file.stem, sql_file.read_text(encoding="utf-8")
            path = dbs_dir / f"{db_id}.sqlite"
            tmp = path.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)
            conn = sqlite3.connect(tmp)
            conn.executescript(text)
            conn.execute("VACUUM")
            conn.close()
            tmp.replace(path)
            conns[db_id] = sqlite3.connect(path)
            schemas[db_id] = "\n".join(line for line in text.splitlines() if line.startswith("CREATE TABLE "))
            tables = [r[0] for r in conns[db_id].execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            db_stats[db_id] = {
                "split": INDEPENDENT_SPLIT,
                "description": text.splitlines()[0].removeprefix("-- ").split(": ", 1)[1],
                "tables": {t: conns[db_id].execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables},
                "size_bytes": path.stat().st_size,
            }
        items: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        lines = (INDEPENDENT_DIR / "questions.jsonl").read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            item = json.loads(line)
            db_id = item["db_id"]
            if db_id not in conns or item["tier"] not in TEMPLATES:
                raise ValueError(f"questions.jsonl line {number}: unknown db_id {db_id!r} or tier {item['tier']!r}")
            rows = conns[db_id].execute(item["gold_sql"]).fetchall()
            if not _usable(rows):
                raise ValueError(f"questions.jsonl line {number}: the gold query gives no usable result ({rows!r})")
            items.append(
                {**item, "id": f"{db_id}-{counts.get(db_id, 0)}", "template": "handwritten", "rows": len(rows)}
            )
            counts[db_id] = counts.get(db_id, 0) + 1
    finally:
        for conn in conns.values():
            conn.close()
    for db_id, d in db_stats.items():
        mine = [i for i in items if i["db_id"] == db_id]
        d["questions"] = len(mine)
        d["mean_result_rows"] = round(statistics.mean(i["rows"] for i in mine), 2)
        d["size_bytes"] = d.pop("size_bytes")
    return items, schemas, db_stats


def _write_jsonl(path: Path, items: list[dict[str, Any]]) -> None:
    keys = ("id", "db_id", "question", "gold_sql", "tier")
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for item in items:
            handle.write(json.dumps({k: item[k] for k in keys}, ensure_ascii=False) + "\n")


def build(out_dir: Path) -> dict[str, Any]:
    """(Re)build every database and question file under ``out_dir``; return the statistics."""
    rng = random.Random(SEED)
    dbs_dir = out_dir / "dbs"
    dbs_dir.mkdir(parents=True, exist_ok=True)
    schemas: dict[str, str] = {}
    per_split: dict[str, list[dict[str, Any]]] = {"train": [], "dev": [], "test": [], INDEPENDENT_SPLIT: []}
    db_stats: dict[str, dict[str, Any]] = {}
    for generated in generated_databases():
        db, split = generated.db, generated.split
        path = dbs_dir / f"{db.db_id}.sqlite"
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        conn = sqlite3.connect(tmp)
        try:
            populate(db, conn, random.Random(f"{SEED}-{db.db_id}-data"))
            rng_questions = random.Random(f"{SEED}-{db.db_id}-questions")
            items = questions_for_db(db, conn, rng_questions, wrap_unmatched=db.db_id not in SPLIT_OF_DB)
            conn.execute("VACUUM")
        finally:
            conn.close()
        tmp.replace(path)
        schemas[db.db_id] = "\n".join(t.ddl() for t in db.tables)
        per_split[split].extend(items)
        db_stats[db.db_id] = {
            "split": split,
            "description": db.description,
            "sources": list(generated.sources),
            "style": generated.style.describe(),
            "tables": {t.name: t.rows for t in db.tables},
            "questions": len(items),
            "mean_result_rows": round(statistics.mean(i["rows"] for i in items), 2),
            "size_bytes": path.stat().st_size,
        }
    independent, independent_schemas, independent_stats = independent_databases(dbs_dir)
    per_split[INDEPENDENT_SPLIT] = independent
    schemas.update(independent_schemas)
    db_stats.update(independent_stats)
    stats: dict[str, Any] = {"seed": SEED, "splits": {}, "databases": db_stats}
    for split, items in per_split.items():
        rng.shuffle(items)
        _write_jsonl(out_dir / f"{split}.jsonl", items)
        tiers = {tier: sum(1 for i in items if i["tier"] == tier) for tier in TEMPLATES}
        tables = [len(db_stats[db_id]["tables"]) for db_id in {i["db_id"] for i in items}]
        stats["splits"][split] = {
            "db_ids": sorted({i["db_id"] for i in items}),
            "questions": len(items),
            "tiers": tiers,
            "mean_result_rows": round(statistics.mean(i["rows"] for i in items), 2),
            "mean_gold_sql_chars": round(statistics.mean(len(i["gold_sql"]) for i in items), 1),
            "rephrased": sum(1 for i in items if i.get("rephrased")),
            "tables_per_db": [min(tables), max(tables)],
            "templates": dict(
                sorted({t: sum(1 for i in items if i["template"] == t) for t in {i["template"] for i in items}}.items())
            ),
        }
    all_items = [i for items in per_split.values() for i in items]
    stats["total"] = {
        "databases": len(db_stats),
        "questions": len(all_items),
        "tiers": {tier: sum(1 for i in all_items if i["tier"] == tier) for tier in TEMPLATES},
        "size_bytes": sum(s["size_bytes"] for s in db_stats.values()),
    }
    (out_dir / "schemas.json").write_text(json.dumps(schemas, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return stats


def _schema_line(db: Db) -> str:
    tables = []
    for t in db.tables:
        cols = ([] if t.bridge else [t.pk]) + [f"{c.name}->{c.ref}" if c.kind == "fk" else c.name for c in t.cols]
        tables.append(f"{t.name}({', '.join(cols)})")
    return "; ".join(tables)


def render_markdown(stats: dict[str, Any]) -> str:
    """DATASET.md: how the data was built, the schemas, and the numbers from ``stats``."""
    tiers = list(TEMPLATES)
    generated = generated_databases()
    train = [g for g in generated if g.split == "train"]
    independent = [d for d in stats["databases"].values() if d["split"] == INDEPENDENT_SPLIT]
    lines = [
        "# SQL agent dataset",
        "",
        "A small text-to-SQL dataset in the spirit of Spider, generated offline by",
        "`build_dataset.py` (seeded, standard library only; rerunning it gives byte-identical",
        "files). **This file is generated by the same script; do not edit the numbers by hand.**",
        "",
        "```bash",
        "python -m examples.sql_agent.build_dataset   # rebuilds data/ and this file",
        "```",
        "",
        "## How it was built",
        "",
        f"* {len(DATABASES)} hand-specified domains (`DATABASES`), each with 3-5 tables linked by foreign",
        "  keys, give the dev and test databases and six training ones; "
        f"{len(extra_domains())} more domains (`domains.py`: 4-8 tables,",
        "  most with a junction table, some with two foreign keys into one table) and",
        f"  {MERGED_DATABASES} merges of two training domains in one schema give the other training",
        f"  databases: {len(train)} training databases of 3-12 tables (every {TRIM_EVERY}th extra domain keeps only",
        "  its first three). Names and values come from small word lists; categorical columns",
        "  have skewed frequencies and about 12% of referenced rows have no children, so",
        '  "most common" and "which X have no Y" questions have definite answers.',
        f"* {QUESTIONS_PER_DB} questions per database from generic templates (2-3 paraphrases",
        "  each) filled with values present in the data, in four tiers with fixed quotas per",
        "  database: " + ", ".join(f"`{t}` {n}" for t, n in TIER_QUOTA.items()) + ".",
        "  * `easy`: one table: count, filter on one column, lookup, MIN/MAX/AVG, DISTINCT.",
        "  * `medium`: one table: AND/OR filters, BETWEEN, ORDER BY (+ LIMIT), GROUP BY.",
        "  * `join`: two tables joined on a foreign key, filtered or aggregated.",
        "  * `hard`: join + GROUP BY/HAVING, argmax over groups, nested subqueries",
        "    (above average, NOT IN), three-table joins through a link table.",
        "* Every gold query is executed while building. Kept only if the result is non-empty,",
        f"  not all NULL and at most {MAX_RESULT_ROWS} rows; ORDER BY/LIMIT questions are kept",
        "  only when no ties make the answer ambiguous. Duplicate SQL/questions are dropped.",
        "* **Schema conventions vary by database** (`Style`: hand-chosen for the first ten,",
        "  drawn per database for the others), so what is learned is reading a schema, not one",
        "  house style: snake_case, camelCase or PascalCase names; plural or singular table",
        "  names; abbreviated column words (`dept`, `yr`, `qty`); key columns named `id`,",
        "  `<table>_id` or `<table>_no` (link tables keep a composite key of two foreign keys);",
        "  foreign keys named `<x>_id`, `<x>_ref`, `fk_<x>` or `<x>`, declared inline or as",
        "  `FOREIGN KEY` constraints; SQLite or ANSI type names (`INT`, `VARCHAR(80)`, `FLOAT`);",
        "  0-3 distractor columns per table no question asks about (schema size).",
        "* **Training databases also draw names that cannot be guessed from a question's words**:",
        '  UPPER_SNAKE and quoted names with spaces (`"hire year"`), table prefixes and suffixes',
        "  (`tblClient`, `t_client`, `client_data`), synonyms of the question's words (`clients` for",
        "  customers, `town` for city) and legacy squeezed words (`cstm_nm`). Two of these conventions",
        "  (UPPER_SNAKE, `tbl` prefixes, quoted names) also occur in the hand-written `independent`",
        "  databases: that group measures databases nobody generated, not conventions nobody",
        "  generated. No generated table takes a hand-written database's table name.",
        f"  {len({g.style for g in train})} different styles among the {len(train)} training databases.",
        "* **Phrasing varies beyond the templates**: about half of the questions get another",
        '  opening ("Give me the", "Tell me which", ...) or a wrapper (a label, a trailing',
        "  instruction, a lowercase request without punctuation).",
        "* The split is **by database**, and dev and test domains never enter a training database",
        "  (not even merged or restyled): no database is shared between splits. Every generated",
        "  database uses the same templates and tier quotas, so the test databases are as typical",
        "  as the training ones. The first ten domains' questions are the same as before the",
        "  training set grew, so figures measured on dev and test stay comparable.",
        f"* **`{INDEPENDENT_SPLIT}`: a test group designed apart from the generator.** {len(independent)} hand-written",
        "  databases (`independent/<db_id>.sql`, schema and data) with hand-written questions and",
        "  gold SQL (`independent/questions.jsonl`), in domains, conventions and SQL no template",
        "  produces: UPPER_SNAKE, `tbl`-prefixed, run-together and quoted names with spaces,",
        "  columns tagged by table (`p_elo`), text natural keys, composite and self-referencing",
        "  keys, two foreign keys into one table, timestamps and date arithmetic, NULL for events",
        "  not yet happened, 'Y'/'N' flags, money in cents, INTERSECT, UNION ALL, CASE,",
        "  percentages, conversational phrasing. It measures whether a skill carries over to",
        "  databases the generator never shaped; never used for training or for choosing a",
        "  recipe (dev is). The build checks every gold query executes and returns a non-empty",
        "  result.",
        "* Scoring (`sql_data.execution_match`): execution accuracy; results compared as",
        "  multisets of rows, order-sensitive only when the gold query has a top-level ORDER BY.",
        "",
        f"Files: `data/dbs/<db_id>.sqlite`, `data/{{train,dev,test,{INDEPENDENT_SPLIT}}}.jsonl` (fields `id`, `db_id`,",
        "`question`, `gold_sql`, `tier`; lines in a seeded shuffled order), `data/schemas.json`",
        "(db_id -> CREATE TABLE statements shown to the agent), `data/stats.json`.",
        "",
        "## Databases",
        "",
        "| db_id | split | domain | conventions | schema |",
        "|---|---|---|---|---|",
    ]
    for g in generated:
        lines.append(
            f"| `{g.db.db_id}` | {g.split} | {g.db.description} | {g.style.describe()} | {_schema_line(g.db)} |"
        )
    for db_id, d in stats["databases"].items():
        if d["split"] == INDEPENDENT_SPLIT:
            lines.append(
                f"| `{db_id}` | {INDEPENDENT_SPLIT} | {d['description']} | hand-written | see `independent/` |"
            )
    lines += [
        "",
        "## Statistics",
        "",
        "| split | databases | questions | " + " | ".join(tiers) + " | mean result rows |",
        "|---|---|---|" + "---|" * len(tiers) + "---|",
    ]
    for split, s in stats["splits"].items():
        counts = " | ".join(str(s["tiers"][t]) for t in tiers)
        lines.append(f"| {split} | {', '.join(s['db_ids'])} | {s['questions']} | {counts} | {s['mean_result_rows']} |")
    total = stats["total"]
    lines += [
        f"| **total** | {total['databases']} | {total['questions']} | "
        + " | ".join(str(total["tiers"][t]) for t in tiers)
        + " | |",
        "",
        "| db_id | rows per table | questions | mean result rows | size (bytes) |",
        "|---|---|---|---|---|",
    ]
    for db_id, d in stats["databases"].items():
        rows = ", ".join(f"{t} {n}" for t, n in d["tables"].items())
        lines.append(f"| `{db_id}` | {rows} | {d['questions']} | {d['mean_result_rows']} | {d['size_bytes']} |")
    lines += ["", f"Total size of the databases: {total['size_bytes']} bytes. Seed: {SEED}.", ""]
    return "\n".join(lines)


def main() -> None:
    """Rebuild ``examples/sql_agent/data/`` and ``DATASET.md``, and print a summary."""
    stats = build(DEFAULT_OUT)
    (HERE / "DATASET.md").write_text(render_markdown(stats), encoding="utf-8")
    for split, s in stats["splits"].items():
        print(f"{split}: {s['questions']} questions on {s['db_ids']} tiers={s['tiers']}")
    print(f"total: {stats['total']}")


if __name__ == "__main__":
    main()
