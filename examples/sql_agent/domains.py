"""Twenty-four more database domains for the generated text-to-SQL training data.

Each ``Db`` here is a spec in the same conventions as ``build_dataset.DATABASES``: snake_case base names (a
``Style`` restyles them later), singular and plural phrases for tables and columns, role phrases for foreign keys
(two foreign keys into one table carry different roles, like "origin depot" and "destination depot"), ``bridge``
tables for many-to-many links with ``link``/``rlink`` phrases, ``quote=True`` on tables whose names are titles.
Sizes vary from four to eight tables; every name generator can produce at least as many unique names as its
table has rows, and every domain yields the full question quota in every style tried.
"""

from __future__ import annotations

import random

from examples.sql_agent.build_dataset import (
    CITIES,
    COUNTRIES,
    Db,
    Table,
    cat,
    code,
    combo,
    fk,
    name,
    num,
    person,
    real,
)

# ---------------------------------------------------------------------------
# Name generators and word lists
# ---------------------------------------------------------------------------

NICK_START = ("Ki", "Ma", "Lu", "Zo", "Ta", "Ra", "Ne", "So", "Bo", "Ja", "Mi", "Fa", "Pi", "Da", "Ro", "Sa")
NICK_END = ("bo", "li", "na", "ra", "ko", "mi", "zu", "to", "ya", "di", "ro", "pe", "lo", "ni")
STREETS = (
    "Oak",
    "Maple",
    "Cedar",
    "Elm",
    "Pine",
    "Willow",
    "Birch",
    "Chestnut",
    "Harbor",
    "Mill",
    "Church",
    "Park",
    "Lake",
    "Hill",
    "Station",
    "River",
)
TAG_START = ("Shadow", "Pixel", "Turbo", "Night", "Frost", "Blaze", "Lucky", "Silent", "Cyber", "Rapid", "Iron", "Nova")
TAG_END = ("Wolf", "Fox", "Ninja", "Rider", "Ghost", "Hawk", "Viper", "Knight", "Bear", "Storm", "Comet", "Byte")
DRUG_START = ("Vex", "Lor", "Zan", "Cal", "Mir", "Tor", "Pel", "Bri", "Dax", "Fen", "Nor", "Syl")
DRUG_END = ("amol", "ivex", "oprin", "azide", "umab", "afen", "itol", "ocin")
REPO_START = ("api", "web", "data", "auth", "billing", "search", "infra", "mobile", "ml", "docs", "events", "media")
REPO_END = ("service", "client", "pipeline", "gateway", "tools", "core", "sdk")
LANGUAGES = ("Python", "Java", "Go", "TypeScript", "Rust", "C++")
REGIONS = ("North", "South", "East", "West", "Central")
PLACES = (
    *CITIES,
    "Ridgeway",
    "Pinecrest",
    "Stonebridge",
    "Westfield",
    "Clearwater",
    "Elmwood",
    "Redhill",
    "Bayview",
    "Northgate",
    "Silverlake",
)


def nickname(rng: random.Random) -> str:
    """An animal's or a pet's name such as ``Kibo`` or ``Lumi``."""
    return rng.choice(NICK_START) + rng.choice(NICK_END)


def address(rng: random.Random) -> str:
    """A street address such as ``412 Maple Avenue``."""
    return f"{rng.randint(1, 999)} {rng.choice(STREETS)} {rng.choice(('Street', 'Avenue', 'Lane', 'Road'))}"


def gamertag(rng: random.Random) -> str:
    """A player handle such as ``PixelFox42``."""
    return f"{rng.choice(TAG_START)}{rng.choice(TAG_END)}{rng.randint(1, 99)}"


def drug(rng: random.Random) -> str:
    """An invented medicine name such as ``Zanoprin``."""
    return rng.choice(DRUG_START) + rng.choice(DRUG_END)


def repo(rng: random.Random) -> str:
    """A repository name such as ``billing-gateway``."""
    return f"{rng.choice(REPO_START)}-{rng.choice(REPO_END)}"


def commit_hash(rng: random.Random) -> str:
    """A short hexadecimal commit hash such as ``3fa9c01``."""
    return f"{rng.getrandbits(28):07x}"


# ---------------------------------------------------------------------------
# The domains
# ---------------------------------------------------------------------------

EXTRA_DOMAINS: tuple[Db, ...] = (
    Db(
        "warehouse",
        "logistics: warehouses, suppliers, products and shipments",
        (
            Table(
                "warehouses",
                "warehouse",
                "warehouses",
                14,
                (
                    name(
                        gen=combo(
                            ("North", "South", "East", "West", "Central", "Harbor", "Valley", "Summit"),
                            ("Depot", "Hub", "Storage Center", "Distribution Center"),
                        )
                    ),
                    cat("region", "region", "regions", ("North", "South", "East", "West")),
                    num("capacity_pallets", "capacity in pallets", 500, 20000, 50),
                    num("opened_year", "opening year", 1990, 2023),
                ),
            ),
            Table(
                "suppliers",
                "supplier",
                "suppliers",
                30,
                (
                    name(
                        gen=combo(
                            (
                                "Acme",
                                "Pioneer",
                                "Global",
                                "Prime",
                                "Summit",
                                "Allied",
                                "Crescent",
                                "Keystone",
                                "Redwood",
                                "Bluewater",
                            ),
                            ("Supply", "Trading", "Industries", "Logistics", "Materials", "Wholesale"),
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    real("reliability_score", "reliability score", 1, 10, 1),
                    num("partner_years", "years as a partner", 1, 25),
                ),
            ),
            Table(
                "products",
                "product",
                "products",
                80,
                (
                    name(
                        gen=combo(
                            (
                                "Steel",
                                "Plastic",
                                "Copper",
                                "Wooden",
                                "Glass",
                                "Rubber",
                                "Aluminum",
                                "Ceramic",
                                "Cotton",
                                "Paper",
                                "Brass",
                                "Nylon",
                            ),
                            (
                                "Bolts",
                                "Pipes",
                                "Crates",
                                "Panels",
                                "Hinges",
                                "Cables",
                                "Sheets",
                                "Valves",
                                "Brackets",
                                "Rolls",
                                "Washers",
                                "Tubes",
                            ),
                        )
                    ),
                    fk("supplier_id", "suppliers", "supplier", "suppliers"),
                    cat(
                        "category",
                        "category",
                        "categories",
                        ("Hardware", "Packaging", "Electrical", "Plumbing", "Raw Materials"),
                    ),
                    real("unit_price", "unit price", 0.5, 250),
                    num("weight_kg", "weight in kilograms", 1, 500),
                ),
            ),
            Table(
                "shipments",
                "shipment",
                "shipments",
                300,
                (
                    name("tracking_code", "tracking code", "tracking codes", gen=code(("SHP",), 10000, 99999, "-")),
                    fk("product_id", "products", "product", "products"),
                    fk("origin_id", "warehouses", "origin warehouse", "origin warehouses"),
                    fk("destination_id", "warehouses", "destination warehouse", "destination warehouses"),
                    num("quantity", "quantity", 10, 2000, 10),
                    cat("status", "status", "statuses", ("delivered", "in transit", "delayed", "cancelled")),
                    num("ship_year", "shipping year", 2019, 2024),
                ),
            ),
        ),
    ),
    Db(
        "zoo",
        "zoo: enclosures, keepers, animals and feedings",
        (
            Table(
                "enclosures",
                "enclosure",
                "enclosures",
                15,
                (
                    name(
                        gen=combo(
                            ("Savanna", "Rainforest", "Arctic", "Desert", "Wetland", "Mountain", "Reef", "Jungle"),
                            ("Habitat", "House", "Zone", "Pavilion"),
                        )
                    ),
                    cat("climate", "climate", "climates", ("Tropical", "Temperate", "Arid", "Polar")),
                    num("area_sqm", "area in square meters", 200, 20000, 50),
                    num("built_year", "construction year", 1960, 2022),
                ),
            ),
            Table(
                "keepers",
                "keeper",
                "keepers",
                35,
                (
                    name(gen=person),
                    fk("enclosure_id", "enclosures", "enclosure", "enclosures"),
                    cat("shift", "shift", "shifts", ("Morning", "Afternoon", "Night")),
                    num("years_experience", "years of experience", 1, 35),
                    num("salary", "salary", 28000, 90000, 500),
                ),
            ),
            Table(
                "animals",
                "animal",
                "animals",
                120,
                (
                    name(gen=nickname),
                    fk("enclosure_id", "enclosures", "enclosure", "enclosures"),
                    cat(
                        "species",
                        "species",
                        "species",
                        ("Lion", "Zebra", "Penguin", "Giraffe", "Flamingo", "Red Panda", "Otter", "Tortoise"),
                    ),
                    cat("diet", "diet", "diets", ("Carnivore", "Herbivore", "Omnivore")),
                    num("age", "age", 1, 40),
                    real("weight_kg", "weight in kilograms", 0.5, 1500, 1),
                ),
            ),
            Table(
                "feedings",
                "feeding",
                "feedings",
                300,
                (
                    fk("keeper_id", "keepers", "keeper", "keepers"),
                    fk("animal_id", "animals", "animal", "animals"),
                    real("food_kg", "food in kilograms", 0.2, 40, 1),
                    num("times_per_week", "number of feedings per week", 1, 14),
                    cat("meal", "meal", "meals", ("Breakfast", "Lunch", "Dinner")),
                ),
                bridge=True,
                link="who feed",
                rlink="fed by",
            ),
        ),
    ),
    Db(
        "gym",
        "fitness: gyms, trainers, members, classes and bookings",
        (
            Table(
                "gyms",
                "gym",
                "gyms",
                12,
                (
                    name(gen=combo(CITIES, ("Fitness", "Athletics", "Strength Club"))),
                    cat("tier", "tier", "tiers", ("Basic", "Plus", "Elite")),
                    num("opened_year", "opening year", 2000, 2023),
                    num("floor_area_sqm", "floor area in square meters", 300, 5000, 10),
                    real("monthly_fee", "monthly fee", 15, 120),
                ),
            ),
            Table(
                "trainers",
                "trainer",
                "trainers",
                30,
                (
                    name(gen=person),
                    fk("gym_id", "gyms", "gym", "gyms"),
                    cat("specialty", "specialty", "specialties", ("Yoga", "Strength", "Cardio", "Pilates", "Boxing")),
                    num("years_experience", "years of experience", 1, 25),
                    real("hourly_rate", "hourly rate", 20, 120),
                ),
            ),
            Table(
                "members",
                "member",
                "members",
                150,
                (
                    name(gen=person),
                    fk("home_gym_id", "gyms", "home gym", "home gyms"),
                    cat("plan", "plan", "plans", ("Monthly", "Annual", "Student", "Off-Peak")),
                    num("age", "age", 16, 80),
                    num("join_year", "join year", 2012, 2024),
                ),
            ),
            Table(
                "classes",
                "class",
                "classes",
                40,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            ("Morning", "Evening", "Power", "Gentle", "Express", "Weekend", "Advanced", "Beginner"),
                            ("Yoga", "Spin", "HIIT", "Pilates", "Boxing", "Zumba", "Circuit", "Stretch"),
                        ),
                    ),
                    fk("trainer_id", "trainers", "trainer", "trainers"),
                    cat("intensity", "intensity", "intensities", ("Low", "Medium", "High")),
                    num("duration_minutes", "duration in minutes", 30, 90, 5),
                    num("max_participants", "maximum number of participants", 8, 40),
                ),
                quote=True,
            ),
            Table(
                "bookings",
                "booking",
                "bookings",
                300,
                (
                    fk("member_id", "members", "member", "members"),
                    fk("class_id", "classes", "class", "classes"),
                    cat("status", "status", "statuses", ("attended", "cancelled", "no-show")),
                    num("rating", "rating", 1, 5),
                ),
                bridge=True,
                link="booked into",
                rlink="booked by",
            ),
        ),
    ),
    Db(
        "car_rental",
        "car rental: branches, cars, customers and rentals",
        (
            Table(
                "branches",
                "branch",
                "branches",
                12,
                (
                    name(gen=combo(CITIES, ("Airport", "Downtown", "Station"))),
                    cat("region", "region", "regions", ("North", "South", "Coastal", "Inland")),
                    num("opened_year", "opening year", 1985, 2023),
                    num("parking_spaces", "number of parking spaces", 20, 400),
                ),
            ),
            Table(
                "cars",
                "car",
                "cars",
                80,
                (
                    name(
                        "plate",
                        "license plate",
                        "license plates",
                        gen=code(("CR", "RT", "KX", "LM", "ZP"), 1000, 9999, "-"),
                    ),
                    fk("branch_id", "branches", "branch", "branches"),
                    cat("make", "make", "makes", ("Toyota", "Ford", "Volkswagen", "Honda", "Kia", "BMW", "Renault")),
                    cat("fuel_type", "fuel type", "fuel types", ("Petrol", "Diesel", "Hybrid", "Electric")),
                    num("model_year", "model year", 2015, 2024),
                    real("daily_rate", "daily rate", 25, 180),
                ),
            ),
            Table(
                "customers",
                "customer",
                "customers",
                120,
                (
                    name(gen=person),
                    fk("home_branch_id", "branches", "home branch", "home branches"),
                    cat("loyalty_level", "loyalty level", "loyalty levels", ("None", "Silver", "Gold")),
                    num("age", "age", 21, 80),
                    num("license_year", "year the license was issued", 1975, 2023),
                ),
            ),
            Table(
                "rentals",
                "rental",
                "rentals",
                300,
                (
                    fk("customer_id", "customers", "customer", "customers"),
                    fk("car_id", "cars", "car", "cars"),
                    num("days", "number of days", 1, 30),
                    real("total_cost", "total cost", 30, 4000),
                    cat("status", "status", "statuses", ("returned", "active", "late", "cancelled")),
                ),
                bridge=True,
                link="who rented",
                rlink="rented by",
            ),
        ),
    ),
    Db(
        "vet_clinic",
        "veterinary care: clinics, vets, owners, pets and visits",
        (
            Table(
                "clinics",
                "clinic",
                "clinics",
                10,
                (
                    name(
                        gen=(
                            "Happy Paws Clinic",
                            "Riverside Animal Hospital",
                            "Oakdale Vet Center",
                            "Furry Friends Clinic",
                            "Greenfield Animal Care",
                            "Lakeside Veterinary",
                            "Northside Pet Hospital",
                            "Companion Care Clinic",
                            "Sunny Meadow Vets",
                            "Harbor Animal Clinic",
                            "Whiskers and Tails",
                            "Brighton Pet Care",
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("founded_year", "founding year", 1970, 2020),
                    num("exam_rooms", "number of exam rooms", 2, 12),
                ),
            ),
            Table(
                "vets",
                "vet",
                "vets",
                30,
                (
                    name(gen=person),
                    fk("clinic_id", "clinics", "clinic", "clinics"),
                    cat(
                        "specialty",
                        "specialty",
                        "specialties",
                        ("General Practice", "Surgery", "Dentistry", "Exotic Animals", "Dermatology"),
                    ),
                    num("years_experience", "years of experience", 1, 35),
                ),
            ),
            Table(
                "owners",
                "owner",
                "owners",
                100,
                (
                    name(gen=person),
                    cat("city", "city", "cities", CITIES),
                    cat("contact_method", "preferred contact method", "contact methods", ("Phone", "Email", "Text")),
                    num("age", "age", 18, 85),
                ),
            ),
            Table(
                "pets",
                "pet",
                "pets",
                150,
                (
                    name(gen=nickname),
                    fk("owner_id", "owners", "owner", "owners"),
                    cat("species", "species", "species", ("Dog", "Cat", "Rabbit", "Parrot", "Hamster", "Turtle")),
                    num("age", "age", 1, 18),
                    real("weight_kg", "weight in kilograms", 0.1, 60, 1),
                ),
            ),
            Table(
                "visits",
                "visit",
                "visits",
                300,
                (
                    fk("pet_id", "pets", "pet", "pets"),
                    fk("vet_id", "vets", "vet", "vets"),
                    real("cost", "cost", 40, 1200),
                    cat("reason", "reason", "reasons", ("Checkup", "Vaccination", "Injury", "Surgery", "Dental")),
                    num("duration_minutes", "duration in minutes", 10, 120, 5),
                ),
                bridge=True,
                link="treated by",
                rlink="who treated",
            ),
        ),
    ),
    Db(
        "real_estate",
        "real estate: agencies, neighborhoods, agents, properties, buyers, offers and viewings",
        (
            Table(
                "agencies",
                "agency",
                "agencies",
                12,
                (
                    name(
                        gen=(
                            "Keystone Realty",
                            "Harbor Homes",
                            "Blue Door Estates",
                            "Summit Property Group",
                            "Cornerstone Realtors",
                            "Maple Lane Realty",
                            "Urban Nest",
                            "Golden Key Estates",
                            "Riverbend Realty",
                            "Open House Partners",
                            "Brick and Beam",
                            "Northway Properties",
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("founded_year", "founding year", 1960, 2020),
                    real("commission_rate", "commission rate", 1.5, 6, 1),
                ),
            ),
            Table(
                "neighborhoods",
                "neighborhood",
                "neighborhoods",
                20,
                (
                    name(
                        gen=combo(
                            ("Old", "North", "South", "West", "East", "Upper", "Lower"),
                            ("Town", "Hills", "Park", "Harbor", "Meadows", "Heights"),
                        )
                    ),
                    cat("city", "city", "cities", CITIES[:5]),
                    num("population", "population", 1000, 60000, 100),
                    real("crime_index", "crime index", 0.5, 9.5, 1),
                ),
            ),
            Table(
                "agents",
                "agent",
                "agents",
                40,
                (
                    name(gen=person),
                    fk("agency_id", "agencies", "agency", "agencies"),
                    cat("license_level", "license level", "license levels", ("Associate", "Broker", "Senior Broker")),
                    num("years_experience", "years of experience", 1, 35),
                    num("deals_closed", "number of closed deals", 0, 300),
                ),
            ),
            Table(
                "properties",
                "property",
                "properties",
                120,
                (
                    name("address", "address", "addresses", gen=address),
                    fk("neighborhood_id", "neighborhoods", "neighborhood", "neighborhoods"),
                    fk("listing_agent_id", "agents", "listing agent", "listing agents"),
                    cat(
                        "property_type",
                        "property type",
                        "property types",
                        ("House", "Apartment", "Townhouse", "Condo", "Studio"),
                    ),
                    num("bedrooms", "number of bedrooms", 1, 6),
                    num("area_sqm", "area in square meters", 30, 400),
                    num("asking_price", "asking price", 80000, 1500000, 1000),
                    num("built_year", "construction year", 1900, 2023),
                ),
            ),
            Table(
                "buyers",
                "buyer",
                "buyers",
                100,
                (
                    name(gen=person),
                    cat("financing", "financing", "financing options", ("Cash", "Mortgage", "Mixed")),
                    num("budget", "budget", 100000, 2000000, 5000),
                    num("household_size", "household size", 1, 6),
                ),
            ),
            Table(
                "offers",
                "offer",
                "offers",
                250,
                (
                    fk("buyer_id", "buyers", "buyer", "buyers"),
                    fk("property_id", "properties", "property", "properties"),
                    num("amount", "offer amount", 70000, 1600000, 1000),
                    cat("status", "status", "statuses", ("accepted", "rejected", "pending", "withdrawn")),
                ),
                bridge=True,
                link="who made offers on",
                rlink="that received offers from",
            ),
            Table(
                "viewings",
                "viewing",
                "viewings",
                300,
                (
                    fk("property_id", "properties", "property", "properties"),
                    fk("buyer_id", "buyers", "buyer", "buyers"),
                    fk("agent_id", "agents", "accompanying agent", "accompanying agents"),
                    num("duration_minutes", "duration in minutes", 10, 90, 5),
                    num("interest_score", "interest score", 1, 10),
                    num("viewing_year", "viewing year", 2019, 2024),
                ),
            ),
        ),
    ),
    Db(
        "conference",
        "conferences: venues, conferences, speakers, talks, attendees, registrations, sponsors and sponsorships",
        (
            Table(
                "venues",
                "venue",
                "venues",
                12,
                (
                    name(
                        gen=combo(
                            ("Grand", "Harbor", "Central", "Royal", "Lakeside", "Metro"),
                            ("Convention Center", "Congress Hall", "Expo Center"),
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("capacity", "capacity", 500, 20000, 100),
                    num("opened_year", "opening year", 1970, 2022),
                ),
            ),
            Table(
                "conferences",
                "conference",
                "conferences",
                25,
                (
                    name(
                        gen=combo(
                            (
                                "Data",
                                "Cloud",
                                "Robotics",
                                "Health",
                                "Climate",
                                "Security",
                                "Quantum",
                                "Mobile",
                                "Design",
                                "Fintech",
                            ),
                            ("Summit", "Forum", "Expo", "Conference"),
                            ("2022", "2023", "2024"),
                        )
                    ),
                    fk("venue_id", "venues", "venue", "venues"),
                    cat("format", "format", "formats", ("In person", "Hybrid", "Online")),
                    num("days", "number of days", 1, 5),
                    real("ticket_price", "ticket price", 50, 1500),
                ),
                quote=True,
            ),
            Table(
                "speakers",
                "speaker",
                "speakers",
                60,
                (
                    name(gen=person),
                    cat(
                        "affiliation_type",
                        "affiliation type",
                        "affiliation types",
                        ("University", "Industry", "Government", "Nonprofit"),
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    num("h_index", "h-index", 0, 90),
                ),
            ),
            Table(
                "talks",
                "talk",
                "talks",
                140,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Scaling",
                                "Understanding",
                                "Rethinking",
                                "Securing",
                                "Teaching",
                                "Measuring",
                                "Automating",
                                "Designing",
                                "Testing",
                                "Debugging",
                                "Governing",
                                "Simulating",
                            ),
                            (
                                "Neural Networks",
                                "Supply Chains",
                                "Edge Devices",
                                "Public Data",
                                "Smart Cities",
                                "Open Source",
                                "Quantum Circuits",
                                "Clinical Trials",
                                "Microservices",
                                "Carbon Markets",
                                "Language Models",
                                "Sensor Networks",
                                "Payment Systems",
                                "Social Robots",
                                "Genome Data",
                                "Power Grids",
                            ),
                        ),
                    ),
                    fk("conference_id", "conferences", "conference", "conferences"),
                    fk("speaker_id", "speakers", "speaker", "speakers"),
                    cat("session_type", "session type", "session types", ("Keynote", "Paper", "Panel", "Workshop")),
                    num("duration_minutes", "duration in minutes", 15, 90, 5),
                    num("audience", "audience size", 10, 2000, 10),
                ),
                quote=True,
            ),
            Table(
                "attendees",
                "attendee",
                "attendees",
                150,
                (
                    name(gen=person),
                    cat(
                        "occupation",
                        "occupation",
                        "occupations",
                        ("Student", "Researcher", "Engineer", "Manager", "Journalist"),
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    num("age", "age", 19, 75),
                ),
            ),
            Table(
                "registrations",
                "registration",
                "registrations",
                300,
                (
                    fk("attendee_id", "attendees", "attendee", "attendees"),
                    fk("conference_id", "conferences", "conference", "conferences"),
                    cat("ticket_type", "ticket type", "ticket types", ("Early Bird", "Standard", "Student", "VIP")),
                    real("fee_paid", "fee paid", 0, 1500),
                ),
                bridge=True,
                link="registered for",
                rlink="attended by",
            ),
            Table(
                "sponsors",
                "sponsor",
                "sponsors",
                30,
                (
                    name(
                        gen=combo(
                            ("Apex", "Vertex", "Nimbus", "Orion", "Zenith", "Titan", "Evergreen", "Lumen"),
                            ("Labs", "Systems", "Capital", "Networks", "Analytics"),
                        )
                    ),
                    cat("industry", "industry", "industries", ("Software", "Hardware", "Finance", "Consulting")),
                    num("founded_year", "founding year", 1950, 2022),
                ),
            ),
            Table(
                "sponsorships",
                "sponsorship",
                "sponsorships",
                100,
                (
                    fk("sponsor_id", "sponsors", "sponsor", "sponsors"),
                    fk("conference_id", "conferences", "conference", "conferences"),
                    num("amount", "sponsorship amount", 5000, 500000, 5000),
                    cat("level", "sponsorship level", "sponsorship levels", ("Bronze", "Silver", "Gold", "Platinum")),
                ),
                bridge=True,
                link="that sponsored",
                rlink="sponsored by",
            ),
        ),
    ),
    Db(
        "bank",
        "banking: branches, customers, accounts and transfers",
        (
            Table(
                "branches",
                "branch",
                "branches",
                15,
                (
                    name(gen=combo(CITIES, ("Main", "Central", "North", "Market Street"))),
                    cat("region", "region", "regions", REGIONS),
                    num("opened_year", "opening year", 1950, 2022),
                    num("staff", "number of staff", 5, 60),
                ),
            ),
            Table(
                "customers",
                "customer",
                "customers",
                120,
                (
                    name(gen=person),
                    fk("home_branch_id", "branches", "home branch", "home branches"),
                    cat("segment", "segment", "segments", ("Retail", "Private", "Business", "Student")),
                    num("age", "age", 18, 90),
                    num("credit_score", "credit score", 300, 850),
                ),
            ),
            Table(
                "accounts",
                "account",
                "accounts",
                200,
                (
                    name(
                        "account_number",
                        "account number",
                        "account numbers",
                        gen=code(("ACC",), 100000, 999999, "-"),
                    ),
                    fk("holder_id", "customers", "account holder", "account holders"),
                    cat("account_type", "account type", "account types", ("Checking", "Savings", "Business", "Joint")),
                    real("balance", "balance", 0, 250000),
                    real("interest_rate", "interest rate", 0, 5),
                    num("opened_year", "opening year", 2000, 2024),
                ),
            ),
            Table(
                "transfers",
                "transfer",
                "transfers",
                350,
                (
                    name("reference", "reference", "references", gen=code(("TRF",), 100000, 999999, "-")),
                    fk("sender_account_id", "accounts", "sending account", "sending accounts"),
                    fk("recipient_account_id", "accounts", "receiving account", "receiving accounts"),
                    real("amount", "amount", 5, 50000),
                    cat("channel", "channel", "channels", ("Online", "Mobile", "Branch", "ATM")),
                    num("transfer_year", "transfer year", 2020, 2024),
                ),
            ),
        ),
    ),
    Db(
        "museum",
        "museums: museums, curators, artists, artworks, exhibitions and exhibition items",
        (
            Table(
                "museums",
                "museum",
                "museums",
                12,
                (
                    name(
                        gen=(
                            "City Art Museum",
                            "Harbor Gallery",
                            "National Portrait House",
                            "Modern Arts Center",
                            "Riverside Museum",
                            "Hillcrest Collection",
                            "Old Mill Gallery",
                            "Museum of Light",
                            "Crown Palace Museum",
                            "Northern Arts Hall",
                            "Lakeside Sculpture Park",
                            "Meridian Gallery",
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("founded_year", "founding year", 1850, 2010),
                    num("annual_visitors", "number of annual visitors", 20000, 3000000, 1000),
                ),
            ),
            Table(
                "curators",
                "curator",
                "curators",
                25,
                (
                    name(gen=person),
                    fk("museum_id", "museums", "museum", "museums"),
                    cat(
                        "specialty",
                        "specialty",
                        "specialties",
                        ("Painting", "Sculpture", "Photography", "Antiquities", "Modern Art"),
                    ),
                    num("years_experience", "years of experience", 1, 40),
                ),
            ),
            Table(
                "artists",
                "artist",
                "artists",
                50,
                (
                    name(gen=person),
                    cat("nationality", "nationality", "nationalities", COUNTRIES),
                    cat(
                        "movement",
                        "movement",
                        "movements",
                        ("Impressionism", "Cubism", "Surrealism", "Realism", "Abstract", "Pop Art", "Baroque"),
                    ),
                    num("birth_year", "birth year", 1600, 1990),
                ),
            ),
            Table(
                "artworks",
                "artwork",
                "artworks",
                150,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Portrait of",
                                "Study of",
                                "Still Life with",
                                "View of",
                                "Dream of",
                                "Memory of",
                                "Song of",
                                "Light on",
                                "Shadows of",
                                "Return of",
                                "Letter to",
                                "Farewell to",
                            ),
                            (
                                "a Woman",
                                "the Sea",
                                "Apples",
                                "the Harbor",
                                "a Garden",
                                "the Mountains",
                                "a Child",
                                "the City",
                                "Flowers",
                                "the Night",
                                "Winter",
                                "the River",
                                "a Dancer",
                                "the Bridge",
                                "a Horse",
                                "the Orchard",
                                "the Cathedral",
                                "a Stranger",
                                "the Valley",
                                "the Moon",
                            ),
                        ),
                    ),
                    fk("artist_id", "artists", "artist", "artists"),
                    fk("museum_id", "museums", "owning museum", "owning museums"),
                    cat("medium", "medium", "media", ("Oil", "Watercolor", "Bronze", "Marble", "Photography", "Ink")),
                    num("year_created", "year of creation", 1600, 2020),
                    real("insured_value_millions", "insured value in millions", 0.1, 80, 1),
                ),
                quote=True,
            ),
            Table(
                "exhibitions",
                "exhibition",
                "exhibitions",
                30,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            ("Light and", "Faces of", "Echoes of", "Visions of", "Masters of", "Colors of"),
                            ("Shadow", "the North", "Modernity", "the Sea", "the City", "Silence", "Time"),
                        ),
                    ),
                    fk("museum_id", "museums", "host museum", "host museums"),
                    cat(
                        "exhibition_type", "exhibition type", "exhibition types", ("Permanent", "Temporary", "Touring")
                    ),
                    num("start_year", "start year", 2010, 2024),
                    num("visitors", "number of visitors", 1000, 400000, 500),
                ),
                quote=True,
            ),
            Table(
                "exhibition_items",
                "exhibition item",
                "exhibition items",
                250,
                (
                    fk("exhibition_id", "exhibitions", "exhibition", "exhibitions"),
                    fk("artwork_id", "artworks", "artwork", "artworks"),
                    num("room_number", "room number", 1, 30),
                    cat("display", "display type", "display types", ("Wall", "Pedestal", "Glass Case")),
                ),
                bridge=True,
                link="that include",
                rlink="shown in",
            ),
        ),
    ),
    Db(
        "farm",
        "agriculture: farms, fields, crops and harvests",
        (
            Table(
                "farms",
                "farm",
                "farms",
                15,
                (
                    name(
                        gen=combo(
                            ("Green", "Sunny", "Willow", "Oak", "Maple", "Red Barn", "Cedar", "Hilltop"),
                            ("Acres", "Farm", "Meadows", "Ranch"),
                        )
                    ),
                    cat("region", "region", "regions", ("North Valley", "River Plain", "Highlands", "Coast")),
                    cat("farming_method", "farming method", "farming methods", ("Organic", "Conventional", "Mixed")),
                    num("area_hectares", "area in hectares", 20, 2000, 5),
                    num("established_year", "year of establishment", 1850, 2015),
                ),
            ),
            Table(
                "fields",
                "field",
                "fields",
                60,
                (
                    name("field_code", "field code", "field codes", gen=code(("N", "S", "E", "W"), 1, 60, "-")),
                    fk("farm_id", "farms", "farm", "farms"),
                    cat("soil_type", "soil type", "soil types", ("Clay", "Sandy", "Loam", "Silt", "Peat")),
                    cat("irrigation", "irrigation method", "irrigation methods", ("Drip", "Sprinkler", "Rain-fed")),
                    real("area_hectares", "area in hectares", 1, 80, 1),
                ),
            ),
            Table(
                "crops",
                "crop",
                "crops",
                20,
                (
                    name(
                        gen=(
                            "Wheat",
                            "Barley",
                            "Corn",
                            "Soybean",
                            "Rice",
                            "Oats",
                            "Rye",
                            "Potato",
                            "Tomato",
                            "Carrot",
                            "Onion",
                            "Cabbage",
                            "Sunflower",
                            "Canola",
                            "Lentil",
                            "Chickpea",
                            "Alfalfa",
                            "Sugar Beet",
                            "Cotton",
                            "Pumpkin",
                            "Lettuce",
                            "Strawberry",
                        )
                    ),
                    cat("crop_family", "crop family", "crop families", ("Cereal", "Legume", "Vegetable", "Oilseed")),
                    num("growing_days", "number of growing days", 60, 200),
                    real("seed_cost", "seed cost per hectare", 10, 500),
                ),
            ),
            Table(
                "harvests",
                "harvest",
                "harvests",
                300,
                (
                    fk("field_id", "fields", "field", "fields"),
                    fk("crop_id", "crops", "crop", "crops"),
                    num("harvest_year", "harvest year", 2015, 2024),
                    real("yield_tonnes", "yield in tonnes", 0.5, 400, 1),
                    cat("quality_grade", "quality grade", "quality grades", ("Premium", "Standard", "Feed")),
                ),
            ),
        ),
    ),
    Db(
        "hotel",
        "hotels: hotels, rooms, guests and stays",
        (
            Table(
                "hotels",
                "hotel",
                "hotels",
                16,
                (
                    name(
                        gen=combo(
                            ("Grand", "Royal", "Harbor", "Park", "Plaza", "Sunset", "Alpine", "Garden"),
                            ("Hotel", "Inn", "Suites", "Lodge", "Resort"),
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("stars", "star rating", 1, 5),
                    num("opened_year", "opening year", 1900, 2023),
                ),
            ),
            Table(
                "rooms",
                "room",
                "rooms",
                120,
                (
                    name("room_code", "room code", "room codes", gen=code(("A", "B", "C", "D"), 100, 999, "-")),
                    fk("hotel_id", "hotels", "hotel", "hotels"),
                    cat("room_type", "room type", "room types", ("Single", "Double", "Suite", "Family")),
                    num("floor", "floor", 1, 20),
                    real("nightly_rate", "nightly rate", 50, 900),
                    num("max_occupancy", "maximum occupancy", 1, 6),
                ),
            ),
            Table(
                "guests",
                "guest",
                "guests",
                150,
                (
                    name(gen=person),
                    cat("country", "country", "countries", COUNTRIES),
                    cat("loyalty_tier", "loyalty tier", "loyalty tiers", ("None", "Silver", "Gold", "Platinum")),
                    num("age", "age", 18, 90),
                ),
            ),
            Table(
                "stays",
                "stay",
                "stays",
                320,
                (
                    fk("guest_id", "guests", "guest", "guests"),
                    fk("room_id", "rooms", "room", "rooms"),
                    num("nights", "number of nights", 1, 21),
                    cat(
                        "booking_channel", "booking channel", "booking channels", ("Direct", "Travel Agent", "Website")
                    ),
                    real("total_price", "total price", 60, 9000),
                ),
                bridge=True,
                link="who stayed in",
                rlink="occupied by",
            ),
        ),
    ),
    Db(
        "software",
        "software development: teams, developers, repositories, code commits and repository maintainers",
        (
            Table(
                "teams",
                "team",
                "teams",
                12,
                (
                    name(
                        gen=(
                            "Platform",
                            "Payments",
                            "Search",
                            "Mobile",
                            "Data",
                            "Security",
                            "Growth",
                            "Infrastructure",
                            "Identity",
                            "Billing",
                            "Messaging",
                            "Analytics",
                        )
                    ),
                    cat("office", "office", "offices", CITIES[:5]),
                    num("founded_year", "founding year", 2010, 2024),
                    num("budget", "budget", 100000, 3000000, 10000),
                ),
            ),
            Table(
                "developers",
                "developer",
                "developers",
                80,
                (
                    name(gen=person),
                    fk("team_id", "teams", "team", "teams"),
                    cat(
                        "seniority", "seniority", "seniority levels", ("Junior", "Mid", "Senior", "Staff", "Principal")
                    ),
                    cat("primary_language", "primary language", "primary languages", LANGUAGES),
                    num("years_experience", "years of experience", 0, 30),
                ),
            ),
            Table(
                "repositories",
                "repository",
                "repositories",
                40,
                (
                    name(gen=repo),
                    fk("owner_team_id", "teams", "owning team", "owning teams"),
                    cat("language", "language", "languages", LANGUAGES),
                    cat("visibility", "visibility", "visibility levels", ("Public", "Private", "Internal")),
                    num("stars", "number of stars", 0, 5000),
                    num("open_issues", "number of open issues", 0, 300),
                ),
            ),
            Table(
                "commits",
                "code commit",
                "code commits",
                350,
                (
                    name("commit_hash", "commit hash", "commit hashes", gen=commit_hash),
                    fk("repository_id", "repositories", "repository", "repositories"),
                    fk("author_id", "developers", "author", "authors"),
                    fk("reviewer_id", "developers", "reviewer", "reviewers"),
                    num("lines_added", "number of lines added", 1, 2000),
                    num("lines_deleted", "number of lines deleted", 0, 800),
                    cat(
                        "change_type", "change type", "change types", ("feature", "bugfix", "refactor", "docs", "test")
                    ),
                ),
            ),
            Table(
                "repo_maintainers",
                "repository maintainer",
                "repository maintainers",
                120,
                (
                    fk("developer_id", "developers", "developer", "developers"),
                    fk("repository_id", "repositories", "repository", "repositories"),
                    cat("access_level", "access level", "access levels", ("Admin", "Write", "Triage")),
                    num("since_year", "year they became maintainers", 2015, 2024),
                ),
                bridge=True,
                link="who maintain",
                rlink="maintained by",
            ),
        ),
    ),
    Db(
        "theater",
        "theater: theaters, plays, actors, performances and roles",
        (
            Table(
                "theaters",
                "theater",
                "theaters",
                12,
                (
                    name(
                        gen=combo(
                            ("Royal", "Globe", "Lyric", "Apollo", "Empire", "Majestic", "Palace", "Rose"),
                            ("Theater", "Playhouse", "Stage"),
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("seats", "number of seats", 100, 2500, 10),
                    num("opened_year", "opening year", 1880, 2015),
                ),
            ),
            Table(
                "plays",
                "play",
                "plays",
                50,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Midnight",
                                "Winter's",
                                "Broken",
                                "Silent",
                                "Golden",
                                "Last",
                                "Velvet",
                                "Paper",
                                "Stolen",
                                "Crooked",
                            ),
                            (
                                "Garden",
                                "Crown",
                                "Letter",
                                "Mirror",
                                "Bargain",
                                "Orchard",
                                "Masquerade",
                                "Promise",
                                "Tale",
                                "Waltz",
                            ),
                        ),
                    ),
                    cat("genre", "genre", "genres", ("Comedy", "Tragedy", "Musical", "Drama", "Farce")),
                    num("written_year", "year written", 1600, 2023),
                    num("running_minutes", "running time in minutes", 60, 200, 5),
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
                    cat("training", "training", "training backgrounds", ("Conservatory", "University", "Self-taught")),
                    num("birth_year", "birth year", 1950, 2003),
                    num("stage_credits", "number of stage credits", 0, 120),
                ),
            ),
            Table(
                "performances",
                "performance",
                "performances",
                250,
                (
                    fk("play_id", "plays", "play", "plays"),
                    fk("theater_id", "theaters", "theater", "theaters"),
                    num("season_year", "season year", 2015, 2024),
                    num("tickets_sold", "number of tickets sold", 50, 2500, 5),
                    real("avg_ticket_price", "average ticket price", 15, 180),
                    cat("time_slot", "time slot", "time slots", ("Matinee", "Evening", "Late Night")),
                ),
            ),
            Table(
                "roles",
                "role",
                "roles",
                200,
                (
                    fk("actor_id", "actors", "actor", "actors"),
                    fk("play_id", "plays", "play", "plays"),
                    cat("role_size", "role size", "role sizes", ("Lead", "Supporting", "Ensemble", "Understudy")),
                    num("weekly_fee", "weekly fee", 300, 5000, 50),
                ),
                bridge=True,
                link="cast in",
                rlink="that feature",
            ),
        ),
    ),
    Db(
        "election",
        "elections: parties, candidates, districts and results",
        (
            Table(
                "parties",
                "party",
                "parties",
                10,
                (
                    name(
                        gen=(
                            "Green Party",
                            "Liberal Union",
                            "Labour Alliance",
                            "Civic Front",
                            "People's Party",
                            "Progress Party",
                            "National Coalition",
                            "Unity Movement",
                            "Reform Party",
                            "Social Democrats",
                            "Freedom Party",
                            "Rural Alliance",
                        )
                    ),
                    cat(
                        "ideology", "ideology", "ideologies", ("Left", "Center-left", "Center", "Center-right", "Right")
                    ),
                    num("founded_year", "founding year", 1900, 2020),
                    num("members", "number of members", 2000, 400000, 1000),
                ),
            ),
            Table(
                "candidates",
                "candidate",
                "candidates",
                80,
                (
                    name(gen=person),
                    fk("party_id", "parties", "party", "parties"),
                    cat("status", "status", "statuses", ("Incumbent", "Challenger", "Newcomer")),
                    num("age", "age", 25, 80),
                    num("campaign_budget", "campaign budget", 5000, 900000, 1000),
                ),
            ),
            Table(
                "districts",
                "district",
                "districts",
                30,
                (
                    name(gen=combo(CITIES, ("North", "South", "East", "West", "Central"))),
                    cat("region", "region", "regions", ("Urban", "Suburban", "Rural")),
                    num("registered_voters", "number of registered voters", 20000, 400000, 100),
                    real("turnout_rate", "turnout rate", 40, 90, 1),
                ),
            ),
            Table(
                "results",
                "result",
                "results",
                250,
                (
                    fk("candidate_id", "candidates", "candidate", "candidates"),
                    fk("district_id", "districts", "district", "districts"),
                    num("votes", "number of votes", 100, 90000),
                    real("vote_share", "vote share", 0.5, 70, 1),
                    cat("outcome", "outcome", "outcomes", ("won", "lost", "runoff")),
                ),
                bridge=True,
                link="who ran in",
                rlink="contested by",
            ),
        ),
    ),
    Db(
        "space",
        "space exploration: agencies, launch sites, rockets, astronauts, missions, crew assignments and experiments",
        (
            Table(
                "agencies",
                "agency",
                "agencies",
                12,
                (
                    name(
                        gen=(
                            "Orbital Research Agency",
                            "Northern Space Institute",
                            "Pacific Aerospace Authority",
                            "Stellar Exploration Office",
                            "Continental Space Agency",
                            "Aurora Launch Consortium",
                            "Equatorial Space Center",
                            "Deep Sky Directorate",
                            "Meridian Space Bureau",
                            "Atlas Orbital Service",
                            "Southern Cross Space Agency",
                            "Polaris Flight Institute",
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    num("founded_year", "founding year", 1950, 2015),
                    num("annual_budget_millions", "annual budget in millions", 50, 25000, 50),
                ),
            ),
            Table(
                "launch_sites",
                "launch site",
                "launch sites",
                14,
                (
                    name(
                        gen=combo(
                            ("Cape", "Point", "Mount", "Lake", "Desert", "Island"),
                            ("Horizon", "Aurora", "Falcon", "Meridian", "Polaris"),
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    real("latitude", "latitude", -60, 70),
                    num("launch_pads", "number of launch pads", 1, 6),
                ),
            ),
            Table(
                "rockets",
                "rocket",
                "rockets",
                25,
                (
                    name(
                        gen=combo(
                            ("Atlas", "Vega", "Titan", "Nova", "Orion", "Helios", "Kestrel", "Pegasus"),
                            ("I", "II", "III", "IV", "V"),
                        )
                    ),
                    fk("agency_id", "agencies", "operating agency", "operating agencies"),
                    cat("propellant", "propellant", "propellants", ("Liquid", "Solid", "Hybrid")),
                    num("stages", "number of stages", 1, 4),
                    real("payload_tonnes", "payload in tonnes", 1, 140, 1),
                    num("first_flight_year", "first flight year", 1960, 2023),
                ),
            ),
            Table(
                "astronauts",
                "astronaut",
                "astronauts",
                90,
                (
                    name(gen=person),
                    fk("agency_id", "agencies", "agency", "agencies"),
                    cat("specialty", "specialty", "specialties", ("Pilot", "Engineer", "Scientist", "Medic")),
                    num("birth_year", "birth year", 1945, 1995),
                    real("spacewalk_hours", "spacewalk hours", 0, 80, 1),
                ),
            ),
            Table(
                "missions",
                "mission",
                "missions",
                60,
                (
                    name(
                        gen=combo(
                            (
                                "Aurora",
                                "Zephyr",
                                "Odyssey",
                                "Beacon",
                                "Starlight",
                                "Pathfinder",
                                "Horizon",
                                "Nomad",
                                "Lyra",
                                "Vanguard",
                            ),
                            ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10"),
                        )
                    ),
                    fk("rocket_id", "rockets", "rocket", "rockets"),
                    fk("launch_site_id", "launch_sites", "launch site", "launch sites"),
                    cat(
                        "destination",
                        "destination",
                        "destinations",
                        ("Low Earth Orbit", "Moon", "Mars", "Space Station", "Asteroid"),
                    ),
                    num("launch_year", "launch year", 1990, 2024),
                    real("cost_millions", "cost in millions", 50, 3000, 1),
                    cat("outcome", "outcome", "outcomes", ("Success", "Partial Success", "Failure")),
                ),
                quote=True,
            ),
            Table(
                "crew_assignments",
                "crew assignment",
                "crew assignments",
                200,
                (
                    fk("astronaut_id", "astronauts", "astronaut", "astronauts"),
                    fk("mission_id", "missions", "mission", "missions"),
                    cat("crew_role", "crew role", "crew roles", ("Commander", "Pilot", "Specialist", "Engineer")),
                    num("days_in_space", "days in space", 2, 400),
                ),
                bridge=True,
                link="assigned to",
                rlink="crewed by",
            ),
            Table(
                "experiments",
                "experiment",
                "experiments",
                80,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Protein",
                                "Plant",
                                "Plasma",
                                "Bone",
                                "Crystal",
                                "Fluid",
                                "Muscle",
                                "Radiation",
                                "Sleep",
                                "Combustion",
                                "Microbe",
                                "Dust",
                            ),
                            (
                                "Growth",
                                "Dynamics",
                                "Study",
                                "Shielding",
                                "Imaging",
                                "Loss",
                                "Analysis",
                                "Sampling",
                                "Survey",
                                "Response",
                            ),
                        ),
                    ),
                    fk("mission_id", "missions", "mission", "missions"),
                    cat("field", "field", "fields", ("Biology", "Physics", "Materials", "Medicine", "Astronomy")),
                    num("budget", "budget", 10000, 2000000, 1000),
                    num("duration_days", "duration in days", 1, 200),
                ),
                quote=True,
            ),
        ),
    ),
    Db(
        "insurance",
        "insurance: offices, agents, clients, policies and claims",
        (
            Table(
                "offices",
                "office",
                "offices",
                12,
                (
                    name(gen=combo(CITIES, ("Office", "Center"))),
                    cat("region", "region", "regions", REGIONS),
                    num("opened_year", "opening year", 1960, 2022),
                    num("staff", "number of staff", 5, 80),
                ),
            ),
            Table(
                "agents",
                "agent",
                "agents",
                40,
                (
                    name(gen=person),
                    fk("office_id", "offices", "office", "offices"),
                    cat("license_type", "license type", "license types", ("Life", "Property", "Health", "General")),
                    num("years_experience", "years of experience", 1, 40),
                    real("commission_rate", "commission rate", 2, 15, 1),
                ),
            ),
            Table(
                "clients",
                "client",
                "clients",
                150,
                (
                    name(gen=person),
                    fk("advisor_id", "agents", "advisor", "advisors"),
                    cat("city", "city", "cities", CITIES),
                    cat("risk_profile", "risk profile", "risk profiles", ("Low", "Medium", "High")),
                    num("age", "age", 18, 90),
                ),
            ),
            Table(
                "policies",
                "policy",
                "policies",
                250,
                (
                    name("policy_number", "policy number", "policy numbers", gen=code(("POL",), 10000, 99999, "-")),
                    fk("client_id", "clients", "policyholder", "policyholders"),
                    fk("agent_id", "agents", "selling agent", "selling agents"),
                    cat("policy_type", "policy type", "policy types", ("Auto", "Home", "Life", "Health", "Travel")),
                    real("annual_premium", "annual premium", 100, 8000),
                    num("coverage_amount", "coverage amount", 5000, 1000000, 5000),
                    num("start_year", "start year", 2010, 2024),
                ),
            ),
            Table(
                "claims",
                "claim",
                "claims",
                300,
                (
                    name("claim_number", "claim number", "claim numbers", gen=code(("CLM",), 100000, 999999, "-")),
                    fk("policy_id", "policies", "policy", "policies"),
                    real("claimed_amount", "claimed amount", 100, 200000),
                    cat("status", "status", "statuses", ("approved", "denied", "pending", "under review")),
                    num("filed_year", "filing year", 2015, 2024),
                ),
            ),
        ),
    ),
    Db(
        "courier",
        "parcel delivery: depots, couriers, parcels and deliveries",
        (
            Table(
                "depots",
                "depot",
                "depots",
                15,
                (
                    name(gen=combo(CITIES, ("Depot", "Sorting Center"))),
                    cat("region", "region", "regions", REGIONS),
                    num("capacity_parcels", "capacity in parcels", 1000, 50000, 500),
                    num("docks", "number of loading docks", 2, 30),
                ),
            ),
            Table(
                "couriers",
                "courier",
                "couriers",
                60,
                (
                    name(gen=person),
                    fk("home_depot_id", "depots", "home depot", "home depots"),
                    cat("vehicle", "vehicle", "vehicles", ("Van", "Bike", "Cargo Bike", "Truck", "Scooter")),
                    num("years_experience", "years of experience", 0, 30),
                    real("rating", "rating", 1, 5, 1),
                ),
            ),
            Table(
                "parcels",
                "parcel",
                "parcels",
                200,
                (
                    name("tracking_number", "tracking number", "tracking numbers", gen=code(("TRK",), 100000, 999999)),
                    fk("origin_depot_id", "depots", "origin depot", "origin depots"),
                    fk("destination_depot_id", "depots", "destination depot", "destination depots"),
                    real("weight_kg", "weight in kilograms", 0.1, 30, 1),
                    cat("service", "service level", "service levels", ("Standard", "Express", "Same Day", "Economy")),
                    real("postage", "postage", 2, 60),
                ),
            ),
            Table(
                "deliveries",
                "delivery",
                "deliveries",
                300,
                (
                    fk("parcel_id", "parcels", "parcel", "parcels"),
                    fk("courier_id", "couriers", "courier", "couriers"),
                    cat("outcome", "outcome", "outcomes", ("delivered", "recipient absent", "refused", "damaged")),
                    num("attempt_number", "attempt number", 1, 3),
                    num("distance_km", "distance in kilometers", 1, 250),
                ),
                bridge=True,
                link="delivered by",
                rlink="who delivered",
            ),
        ),
    ),
    Db(
        "games",
        "video games: studios, games, players and scores",
        (
            Table(
                "studios",
                "studio",
                "studios",
                15,
                (
                    name(
                        gen=(
                            "Pixel Forge",
                            "Moonlit Games",
                            "Iron Owl Studios",
                            "Blue Comet Interactive",
                            "Red Maple Games",
                            "Thunderbyte",
                            "Paper Crane Studio",
                            "Lost Lantern Games",
                            "Quantum Llama",
                            "Starboard Interactive",
                            "Hollow Tree Games",
                            "Brightside Studios",
                            "Copper Fox Games",
                            "Nightjar Entertainment",
                            "Wild Orchid Games",
                            "Granite Peak Studio",
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    num("founded_year", "founding year", 1980, 2020),
                    num("employees", "number of employees", 5, 3000),
                ),
            ),
            Table(
                "games",
                "game",
                "games",
                50,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Star",
                                "Shadow",
                                "Pixel",
                                "Dragon",
                                "Iron",
                                "Neon",
                                "Crystal",
                                "Rogue",
                                "Cosmic",
                                "Ember",
                            ),
                            (
                                "Quest",
                                "Legends",
                                "Tactics",
                                "Odyssey",
                                "Rush",
                                "Frontier",
                                "Kingdoms",
                                "Arena",
                                "Drift",
                                "Saga",
                            ),
                        ),
                    ),
                    fk("studio_id", "studios", "studio", "studios"),
                    cat(
                        "genre",
                        "genre",
                        "genres",
                        ("RPG", "Shooter", "Strategy", "Puzzle", "Racing", "Platformer", "Sports"),
                    ),
                    cat("platform", "platform", "platforms", ("PC", "Console", "Mobile", "Cross-platform")),
                    num("release_year", "release year", 2000, 2024),
                    real("price", "price", 0, 70),
                ),
                quote=True,
            ),
            Table(
                "players",
                "player",
                "players",
                150,
                (
                    name("gamertag", "gamertag", "gamertags", gen=gamertag),
                    cat("country", "country", "countries", COUNTRIES),
                    num("age", "age", 12, 60),
                    num("join_year", "join year", 2010, 2024),
                ),
            ),
            Table(
                "scores",
                "score",
                "scores",
                350,
                (
                    fk("player_id", "players", "player", "players"),
                    fk("game_id", "games", "game", "games"),
                    num("points", "points", 100, 999900, 100),
                    num("hours_played", "hours played", 1, 800),
                    cat("difficulty", "difficulty", "difficulties", ("Easy", "Normal", "Hard", "Nightmare")),
                ),
                bridge=True,
                link="who played",
                rlink="played by",
            ),
        ),
    ),
    Db(
        "charity",
        "fundraising: charities, campaigns, donors and donations",
        (
            Table(
                "charities",
                "charity",
                "charities",
                14,
                (
                    name(
                        gen=(
                            "Clean Water Trust",
                            "Open Books Foundation",
                            "Safe Paws Rescue",
                            "Green Earth Fund",
                            "Warm Hearts Shelter",
                            "Bright Futures",
                            "Ocean Guardians",
                            "Hope Kitchen",
                            "Helping Hands",
                            "Rainbow Children's Fund",
                            "First Aid Relief",
                            "Forest Friends",
                            "Silver Years Care",
                            "Home for All",
                            "Light the Way",
                        )
                    ),
                    cat(
                        "cause",
                        "cause",
                        "causes",
                        ("Health", "Education", "Environment", "Animals", "Poverty", "Disaster Relief"),
                    ),
                    num("founded_year", "founding year", 1900, 2020),
                    num("staff", "number of staff", 3, 500),
                ),
            ),
            Table(
                "campaigns",
                "campaign",
                "campaigns",
                45,
                (
                    name(
                        gen=combo(
                            ("Clean", "Warm", "Bright", "Safe", "Green", "Healthy", "Open", "Happy"),
                            ("Water", "Winter", "Futures", "Homes", "Forests", "Schools", "Meals", "Oceans"),
                            template="{} Appeal",
                        )
                    ),
                    fk("charity_id", "charities", "charity", "charities"),
                    cat("channel", "channel", "channels", ("Online", "Street", "Events", "Mail")),
                    num("goal_amount", "fundraising goal", 5000, 500000, 1000),
                    num("launch_year", "launch year", 2015, 2024),
                ),
                quote=True,
            ),
            Table(
                "donors",
                "donor",
                "donors",
                150,
                (
                    name(gen=person),
                    cat("city", "city", "cities", CITIES),
                    cat("donor_type", "donor type", "donor types", ("Individual", "Family", "Corporate", "Foundation")),
                    num("first_donation_year", "year of first donation", 2000, 2024),
                ),
            ),
            Table(
                "donations",
                "donation",
                "donations",
                330,
                (
                    fk("donor_id", "donors", "donor", "donors"),
                    fk("campaign_id", "campaigns", "campaign", "campaigns"),
                    real("amount", "amount", 5, 20000),
                    cat(
                        "payment_method",
                        "payment method",
                        "payment methods",
                        ("Card", "Bank Transfer", "Cash", "Check"),
                    ),
                    cat("frequency", "frequency", "frequencies", ("One-off", "Monthly", "Annual")),
                ),
                bridge=True,
                link="who donated to",
                rlink="supported by",
            ),
        ),
    ),
    Db(
        "pharmacy",
        "pharmacies: pharmacies, pharmacists, medicines and prescriptions",
        (
            Table(
                "pharmacies",
                "pharmacy",
                "pharmacies",
                15,
                (
                    name(gen=combo(CITIES, ("Pharmacy", "Drugstore", "Apothecary"))),
                    cat("chain", "chain", "chains", ("Independent", "HealthPlus", "MediCare", "QuickRx")),
                    num("opening_hour", "opening hour", 6, 10),
                    num("staff", "number of staff", 2, 25),
                ),
            ),
            Table(
                "pharmacists",
                "pharmacist",
                "pharmacists",
                45,
                (
                    name(gen=person),
                    fk("pharmacy_id", "pharmacies", "pharmacy", "pharmacies"),
                    cat("qualification", "qualification", "qualifications", ("PharmD", "BPharm", "Technician")),
                    num("years_experience", "years of experience", 1, 40),
                    num("salary", "salary", 35000, 140000, 500),
                ),
            ),
            Table(
                "medicines",
                "medicine",
                "medicines",
                60,
                (
                    name(gen=drug),
                    cat(
                        "drug_class",
                        "drug class",
                        "drug classes",
                        ("Antibiotic", "Analgesic", "Antihistamine", "Antiviral", "Statin", "Antidepressant"),
                    ),
                    cat("form", "form", "forms", ("Tablet", "Capsule", "Syrup", "Injection", "Cream")),
                    real("unit_price", "unit price", 1, 300),
                    num("dosage_mg", "dosage in milligrams", 5, 1000, 5),
                ),
            ),
            Table(
                "prescriptions",
                "prescription",
                "prescriptions",
                300,
                (
                    name("rx_code", "prescription code", "prescription codes", gen=code(("RX",), 100000, 999999, "-")),
                    fk("pharmacist_id", "pharmacists", "dispensing pharmacist", "dispensing pharmacists"),
                    fk("medicine_id", "medicines", "medicine", "medicines"),
                    num("quantity", "quantity", 1, 120),
                    num("refills", "number of refills", 0, 5),
                    cat("patient_group", "patient group", "patient groups", ("Child", "Adult", "Senior")),
                    num("issue_year", "issue year", 2018, 2024),
                ),
            ),
        ),
    ),
    Db(
        "podcast",
        "podcasting: networks, podcasts, hosts, episodes and appearances",
        (
            Table(
                "networks",
                "network",
                "networks",
                12,
                (
                    name(
                        gen=(
                            "Soundwave Media",
                            "Open Mic Network",
                            "Echo Chamber Audio",
                            "Night Owl Radio",
                            "Big Ear Productions",
                            "Tall Tales Audio",
                            "Signal Path Media",
                            "Morning Coffee Network",
                            "Deep Dive Audio",
                            "Static Free Media",
                            "Campfire Stories",
                            "Loud Library",
                        )
                    ),
                    cat("country", "country", "countries", COUNTRIES),
                    cat(
                        "business_model",
                        "business model",
                        "business models",
                        ("Ads", "Subscription", "Listener Supported", "Mixed"),
                    ),
                    num("founded_year", "founding year", 2005, 2022),
                ),
            ),
            Table(
                "podcasts",
                "podcast",
                "podcasts",
                40,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            ("The Daily", "Deep", "Curious", "Late Night", "Weekly", "Hidden", "Open", "Modern"),
                            (
                                "Science",
                                "History",
                                "Money",
                                "Tech",
                                "Mysteries",
                                "Culture",
                                "Health",
                                "Design",
                                "Sports",
                                "Politics",
                            ),
                        ),
                    ),
                    fk("network_id", "networks", "network", "networks"),
                    cat(
                        "category",
                        "category",
                        "categories",
                        ("Comedy", "News", "Education", "True Crime", "Business", "Sports"),
                    ),
                    num("launch_year", "launch year", 2008, 2024),
                    num("subscribers", "number of subscribers", 500, 2000000, 500),
                    real("rating", "rating", 2.5, 5, 1),
                ),
                quote=True,
            ),
            Table(
                "hosts",
                "host",
                "hosts",
                60,
                (
                    name(gen=person),
                    cat("expertise", "expertise", "areas of expertise", ("Journalism", "Comedy", "Science", "Finance")),
                    num("birth_year", "birth year", 1960, 2000),
                    num("followers", "number of followers", 100, 5000000, 100),
                ),
            ),
            Table(
                "episodes",
                "episode",
                "episodes",
                200,
                (
                    name(
                        "title",
                        "title",
                        "titles",
                        gen=combo(
                            (
                                "Inside",
                                "Beyond",
                                "Chasing",
                                "Decoding",
                                "Remembering",
                                "After",
                                "Before",
                                "Finding",
                                "Building",
                                "Breaking",
                                "Saving",
                                "Mapping",
                                "Questioning",
                                "Rebuilding",
                            ),
                            (
                                "the Algorithm",
                                "the Market",
                                "the Storm",
                                "the Truth",
                                "the Deal",
                                "the Myth",
                                "the Signal",
                                "the Record",
                                "the Future",
                                "the Past",
                                "the Game",
                                "the Machine",
                                "the Cure",
                                "the Code",
                                "the Ocean",
                                "the Border",
                                "the Crowd",
                                "the Vote",
                                "the Moon",
                                "the Map",
                                "the Archive",
                                "the Heist",
                                "the Network",
                                "the Harvest",
                            ),
                        ),
                    ),
                    fk("podcast_id", "podcasts", "podcast", "podcasts"),
                    num("episode_number", "episode number", 1, 400),
                    num("duration_minutes", "duration in minutes", 10, 180),
                    num("downloads", "number of downloads", 100, 900000, 100),
                    num("release_year", "release year", 2015, 2024),
                ),
                quote=True,
            ),
            Table(
                "appearances",
                "appearance",
                "appearances",
                300,
                (
                    fk("host_id", "hosts", "host", "hosts"),
                    fk("episode_id", "episodes", "episode", "episodes"),
                    cat("appearance_role", "role", "roles", ("Host", "Co-host", "Guest", "Narrator")),
                    num("minutes_on_air", "minutes on air", 5, 180),
                ),
                bridge=True,
                link="who appeared in",
                rlink="that feature",
            ),
        ),
    ),
    Db(
        "bakery",
        "bakeries: bakeries, bakers, products and orders",
        (
            Table(
                "bakeries",
                "bakery",
                "bakeries",
                12,
                (
                    name(
                        gen=combo(
                            ("Golden", "Rustic", "Little", "Sweet", "Old Mill", "Corner", "Sunrise", "Honey"),
                            ("Crust", "Loaf", "Oven", "Bakehouse", "Patisserie"),
                        )
                    ),
                    cat("city", "city", "cities", CITIES),
                    num("opened_year", "opening year", 1950, 2023),
                    num("seats", "number of seats", 0, 60),
                ),
                quote=True,
            ),
            Table(
                "bakers",
                "baker",
                "bakers",
                40,
                (
                    name(gen=person),
                    fk("bakery_id", "bakeries", "bakery", "bakeries"),
                    cat("shift", "shift", "shifts", ("Early", "Day", "Night")),
                    cat(
                        "specialty", "specialty", "specialties", ("Bread", "Pastry", "Cakes", "Cookies", "Gluten-free")
                    ),
                    num("years_experience", "years of experience", 1, 40),
                ),
            ),
            Table(
                "products",
                "product",
                "products",
                50,
                (
                    name(
                        gen=combo(
                            (
                                "Sourdough",
                                "Rye",
                                "Chocolate",
                                "Almond",
                                "Cinnamon",
                                "Lemon",
                                "Raspberry",
                                "Walnut",
                                "Honey",
                                "Poppy Seed",
                            ),
                            (
                                "Loaf",
                                "Croissant",
                                "Muffin",
                                "Tart",
                                "Roll",
                                "Bun",
                                "Cake",
                                "Cookie",
                                "Bagel",
                                "Danish",
                            ),
                        )
                    ),
                    fk("bakery_id", "bakeries", "bakery", "bakeries"),
                    cat("category", "category", "categories", ("Bread", "Pastry", "Cake", "Cookie")),
                    real("price", "price", 1, 40),
                    num("calories", "calories", 80, 900, 10),
                ),
            ),
            Table(
                "orders",
                "order",
                "orders",
                300,
                (
                    name("order_code", "order code", "order codes", gen=code(("BK",), 10000, 99999, "-")),
                    fk("product_id", "products", "product", "products"),
                    fk("baker_id", "bakers", "assigned baker", "assigned bakers"),
                    num("quantity", "quantity", 1, 50),
                    cat("sales_channel", "sales channel", "sales channels", ("Walk-in", "Phone", "Online", "Catering")),
                    real("total", "total price", 2, 800),
                ),
            ),
        ),
    ),
    Db(
        "race",
        "running races: clubs, runners, races and results",
        (
            Table(
                "clubs",
                "club",
                "clubs",
                15,
                (
                    name(gen=combo(CITIES, ("Harriers", "Striders", "Road Runners", "Athletic Club"))),
                    cat("club_type", "club type", "club types", ("Road", "Trail", "Track", "Mixed")),
                    num("founded_year", "founding year", 1900, 2020),
                    num("members", "number of members", 20, 800),
                ),
            ),
            Table(
                "runners",
                "runner",
                "runners",
                150,
                (
                    name(gen=person),
                    fk("club_id", "clubs", "club", "clubs"),
                    cat("age_category", "age category", "age categories", ("Junior", "Senior", "Veteran", "Master")),
                    num("birth_year", "birth year", 1950, 2008),
                    real("best_10k_minutes", "best 10K time in minutes", 28, 75, 1),
                ),
            ),
            Table(
                "races",
                "race",
                "races",
                30,
                (
                    name(gen=combo(CITIES, ("Marathon", "Half Marathon", "10K", "Trail Run", "Fun Run"))),
                    fk("organizer_id", "clubs", "organizing club", "organizing clubs"),
                    cat("terrain", "terrain", "terrains", ("Road", "Trail", "Mixed", "Track")),
                    real("distance_km", "distance in kilometers", 5, 100, 1),
                    num("race_year", "race year", 2015, 2024),
                    num("elevation_gain", "elevation gain", 0, 3000, 10),
                ),
                quote=True,
            ),
            Table(
                "results",
                "result",
                "results",
                320,
                (
                    fk("runner_id", "runners", "runner", "runners"),
                    fk("race_id", "races", "race", "races"),
                    num("finish_minutes", "finish time in minutes", 15, 900),
                    num("overall_place", "overall place", 1, 2000),
                    cat(
                        "finish_status", "finish status", "finish statuses", ("Finished", "DNF", "DNS", "Disqualified")
                    ),
                ),
                bridge=True,
                link="who ran",
                rlink="entered by",
            ),
        ),
    ),
    Db(
        "weather",
        "weather monitoring: regions, stations, sensors and readings",
        (
            Table(
                "regions",
                "region",
                "regions",
                12,
                (
                    name(
                        gen=(
                            "Northern Highlands",
                            "Coastal Plain",
                            "Central Valley",
                            "Eastern Forest",
                            "Southern Desert",
                            "Western Ridge",
                            "Lake District",
                            "River Delta",
                            "High Plateau",
                            "Island Chain",
                            "Pine Barrens",
                            "Red Canyon",
                        )
                    ),
                    cat(
                        "climate_zone",
                        "climate zone",
                        "climate zones",
                        ("Temperate", "Continental", "Mediterranean", "Subarctic", "Arid"),
                    ),
                    num("area_km2", "area in square kilometers", 1000, 90000, 100),
                    num("population_thousands", "population in thousands", 50, 8000),
                ),
            ),
            Table(
                "stations",
                "station",
                "stations",
                40,
                (
                    name(gen=combo(PLACES, ("North", "South", "Airport", "Harbor", "Hill"))),
                    fk("region_id", "regions", "region", "regions"),
                    cat("station_type", "station type", "station types", ("Automatic", "Manual", "Hybrid")),
                    num("elevation_m", "elevation in meters", 0, 3500, 5),
                    num("installed_year", "installation year", 1950, 2023),
                ),
            ),
            Table(
                "sensors",
                "sensor",
                "sensors",
                150,
                (
                    name("serial", "serial number", "serial numbers", gen=code(("SN", "WX"), 1000, 9999, "-")),
                    fk("station_id", "stations", "station", "stations"),
                    cat(
                        "sensor_type",
                        "sensor type",
                        "sensor types",
                        ("Thermometer", "Rain Gauge", "Anemometer", "Barometer", "Hygrometer"),
                    ),
                    cat("manufacturer", "manufacturer", "manufacturers", ("Vaisala", "Campbell", "Davis", "Lufft")),
                    real("accuracy", "accuracy", 0.1, 2, 2),
                    num("calibration_year", "calibration year", 2015, 2024),
                ),
            ),
            Table(
                "readings",
                "reading",
                "readings",
                350,
                (
                    fk("sensor_id", "sensors", "sensor", "sensors"),
                    real("measured_value", "measured value", 0, 200, 1),
                    num("reading_hour", "hour of the reading", 0, 23),
                    num("reading_year", "reading year", 2018, 2024),
                    cat("quality_flag", "quality flag", "quality flags", ("valid", "suspect", "estimated")),
                ),
            ),
        ),
    ),
)
