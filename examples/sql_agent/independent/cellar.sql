-- cellar: a small winery's cellar book: grape lots, barrels, barrel fills, tastings and bottling runs (Access-style quoted names with spaces and symbols, text lot codes, self-referencing blend lot, composite keys, 'Y'/'N' flags, money in cents, ISO dates, NULL = not yet)
CREATE TABLE "Lot" ("Lot Code" TEXT PRIMARY KEY, "Varietal" TEXT, "Vineyard Block" TEXT, "Harvest Date" TEXT, "Brix" REAL, "Tons" REAL, "Blended Into" TEXT REFERENCES "Lot"("Lot Code"), "Organic?" TEXT);
CREATE TABLE "Barrel" ("Barrel #" INTEGER PRIMARY KEY, "Cooper" TEXT, "Oak" TEXT, "Toast" TEXT, "Litres" INTEGER, "Bought" TEXT, "Cost (c)" INTEGER);
CREATE TABLE "Fill" ("Barrel #" INTEGER REFERENCES "Barrel"("Barrel #"), "Lot Code" TEXT REFERENCES "Lot"("Lot Code"), "Filled On" TEXT, "Emptied On" TEXT, PRIMARY KEY ("Barrel #", "Filled On"));
CREATE TABLE "Tasting" ("Lot Code" TEXT REFERENCES "Lot"("Lot Code"), "Tasted On" TEXT, "Taster" TEXT, "Score /20" REAL, "Notes" TEXT, PRIMARY KEY ("Lot Code", "Tasted On", "Taster"));
CREATE TABLE "Bottling" ("Run #" INTEGER PRIMARY KEY, "Lot Code" TEXT REFERENCES "Lot"("Lot Code"), "Bottled On" TEXT, "Cases" INTEGER, "Price/Btl (c)" INTEGER);
INSERT INTO "Lot" VALUES
  ('22BL-R', 'Red Blend', NULL, NULL, NULL, NULL, NULL, 'N'),
  ('22CS-A', 'Cabernet Sauvignon', 'North Slope', '2022-09-28', 24.8, 6.2, '22BL-R', 'N'),
  ('22ME-A', 'Merlot', 'River Flat', '2022-09-15', 23.9, 4.8, '22BL-R', 'N'),
  ('22CF-A', 'Cabernet Franc', 'North Slope', '2022-10-02', 23.1, 1.9, '22BL-R', 'Y'),
  ('22CH-A', 'Chardonnay', 'Hilltop', '2022-09-05', 22.4, 5.5, NULL, 'Y'),
  ('22PN-A', 'Pinot Noir', 'Hilltop', '2022-09-10', 23.0, 3.1, NULL, 'Y'),
  ('23BL-R', 'Red Blend', NULL, NULL, NULL, NULL, NULL, 'N'),
  ('23CS-A', 'Cabernet Sauvignon', 'North Slope', '2023-10-04', 25.3, 5.7, '23BL-R', 'N'),
  ('23ME-A', 'Merlot', 'River Flat', '2023-09-20', 24.1, 5.0, '23BL-R', 'N'),
  ('23SY-A', 'Syrah', 'South Terrace', '2023-09-25', 24.6, 2.4, '23BL-R', 'Y'),
  ('23CH-A', 'Chardonnay', 'Hilltop', '2023-09-01', 22.0, 6.1, NULL, 'Y'),
  ('23SB-A', 'Sauvignon Blanc', 'River Flat', '2023-08-28', 21.2, 4.4, NULL, 'N'),
  ('23PN-A', 'Pinot Noir', 'Hilltop', '2023-09-08', 23.4, 2.8, NULL, 'Y'),
  ('24CH-A', 'Chardonnay', 'Hilltop', '2024-09-03', 22.7, 5.9, NULL, 'Y'),
  ('24PN-A', 'Pinot Noir', 'Hilltop', '2024-09-12', 23.6, 3.3, NULL, 'Y'),
  ('24SY-A', 'Syrah', 'South Terrace', '2024-09-27', 25.0, 2.6, NULL, 'Y');
INSERT INTO "Barrel" VALUES
  (101, 'Taransaud', 'French', 'medium', 225, '2021-06-01', 115000),
  (102, 'Taransaud', 'French', 'medium+', 225, '2021-06-01', 118000),
  (103, 'Seguin Moreau', 'French', 'medium', 225, '2021-07-15', 109000),
  (104, 'Independent Stave', 'American', 'heavy', 225, '2021-07-15', 52000),
  (105, 'Independent Stave', 'American', 'medium', 228, '2022-05-10', 49500),
  (106, 'Kadar', 'Hungarian', 'medium', 225, '2022-05-10', 71000),
  (107, 'Seguin Moreau', 'French', 'light', 300, '2022-08-01', 132000),
  (108, 'Taransaud', 'French', 'heavy', 500, '2022-08-01', 189000),
  (109, 'Kadar', 'Hungarian', 'medium+', 300, '2023-06-20', 88000),
  (110, 'Seguin Moreau', 'French', 'medium+', 228, '2023-06-20', 112500),
  (111, 'Independent Stave', 'American', 'medium+', 225, '2023-06-20', 51000),
  (112, 'Taransaud', 'French', 'light', 228, '2024-07-01', 121000);
INSERT INTO "Fill" VALUES
  (101, '22CS-A', '2022-10-20', '2024-03-15'), (102, '22CS-A', '2022-10-20', '2024-03-15'),
  (103, '22ME-A', '2022-10-05', '2024-02-20'), (104, '22CF-A', '2022-10-25', '2024-01-30'),
  (106, '22PN-A', '2022-10-01', '2023-09-01'), (107, '22CH-A', '2022-09-25', '2023-06-15'),
  (108, '22BL-R', '2024-03-20', '2024-11-05'),
  (107, '23CH-A', '2023-09-20', '2024-07-10'), (106, '23PN-A', '2023-10-01', '2024-09-05'),
  (109, '23CS-A', '2023-10-28', '2025-01-15'), (110, '23CS-A', '2023-10-28', '2025-01-15'),
  (111, '23ME-A', '2023-10-10', '2025-01-10'), (104, '23SY-A', '2024-02-05', '2025-01-10'),
  (105, '23SB-A', '2023-09-15', '2024-02-01'), (108, '23BL-R', '2025-01-20', NULL),
  (107, '24CH-A', '2024-09-25', NULL), (112, '24CH-A', '2024-09-25', NULL),
  (106, '24PN-A', '2024-10-03', NULL), (103, '24SY-A', '2024-10-20', NULL), (101, '24SY-A', '2024-10-20', NULL);
INSERT INTO "Tasting" VALUES
  ('22CS-A', '2023-06-01', 'Marguerite', 15.5, 'tannic, closed'),
  ('22CS-A', '2023-06-01', 'Theo', 15.0, 'green edge'),
  ('22CS-A', '2024-02-10', 'Marguerite', 17.0, 'opening up'),
  ('22ME-A', '2023-06-01', 'Marguerite', 16.0, 'plummy'),
  ('22ME-A', '2024-02-10', 'Ines', 16.5, 'soft'),
  ('22CF-A', '2023-06-01', 'Theo', 14.0, 'herbal'),
  ('22BL-R', '2024-09-15', 'Marguerite', 17.5, 'balanced'),
  ('22BL-R', '2024-09-15', 'Theo', 18.0, 'long finish'),
  ('22BL-R', '2024-09-15', 'Ines', 17.0, NULL),
  ('22CH-A', '2023-05-20', 'Ines', 16.0, 'buttery'),
  ('22PN-A', '2023-08-01', 'Theo', 15.5, 'bright cherry'),
  ('23CH-A', '2024-05-02', 'Ines', 17.5, 'citrus, oak well integrated'),
  ('23CH-A', '2024-05-02', 'Marguerite', 16.5, 'a touch oaky'),
  ('23PN-A', '2024-07-30', 'Theo', 16.0, 'earthy'),
  ('23PN-A', '2024-07-30', 'Ines', 15.0, NULL),
  ('23SB-A', '2024-01-15', 'Ines', 14.5, 'grassy'),
  ('23CS-A', '2024-06-12', 'Marguerite', 16.0, 'dense'),
  ('23ME-A', '2024-06-12', 'Marguerite', 15.0, 'a bit flat'),
  ('23SY-A', '2024-06-12', 'Theo', 17.0, 'pepper, violets'),
  ('23BL-R', '2025-03-01', 'Marguerite', 18.5, 'best yet'),
  ('23BL-R', '2025-03-01', 'Theo', 17.5, NULL),
  ('24CH-A', '2025-02-20', 'Ines', 16.0, 'still reductive'),
  ('24PN-A', '2025-02-20', 'Theo', 15.5, NULL);
INSERT INTO "Bottling" VALUES
  (1, '22CH-A', '2023-07-01', 420, 2400), (2, '22PN-A', '2023-09-20', 250, 3200),
  (3, '22BL-R', '2024-11-20', 610, 3800), (4, '23SB-A', '2024-02-15', 380, 1900),
  (5, '23CH-A', '2024-08-01', 300, 2600), (6, '23CH-A', '2024-10-15', 180, 2600),
  (7, '23PN-A', '2024-09-25', 240, 3400), (8, '22CS-A', '2024-03-25', 60, 5500),
  (9, '23BL-R', '2025-04-10', 560, NULL);
