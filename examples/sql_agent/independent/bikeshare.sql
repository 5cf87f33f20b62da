-- bikeshare: city bike sharing: stations, bikes, rides and servicing (Hungarian tbl prefixes, abbreviated camelCase, two keys into the same table, money in cents)
CREATE TABLE tblStation (stnCode TEXT PRIMARY KEY, stnName TEXT NOT NULL, district TEXT, dockCount INTEGER);
CREATE TABLE tblBike (bikeNo INTEGER PRIMARY KEY, model TEXT, isElectric INTEGER, homeStn TEXT REFERENCES tblStation(stnCode), commissionedOn TEXT);
CREATE TABLE tblRide (rideRef INTEGER PRIMARY KEY, bikeNo INTEGER REFERENCES tblBike(bikeNo), fromStn TEXT REFERENCES tblStation(stnCode), toStn TEXT REFERENCES tblStation(stnCode), startedAt TEXT, durMin INTEGER, fareCents INTEGER, riderType TEXT);
CREATE TABLE tblService (bikeNo INTEGER REFERENCES tblBike(bikeNo), svcDate TEXT, issue TEXT, costCents INTEGER);
INSERT INTO tblStation VALUES
  ('S01', 'Central Square', 'Downtown', 30), ('S02', 'Riverside Park', 'Riverside', 20),
  ('S03', 'Museum Mile', 'Downtown', 24), ('S04', 'Old Mill', 'Northside', 12),
  ('S05', 'Tech Campus', 'Eastgate', 28), ('S06', 'Harbour Steps', 'Riverside', 16);
INSERT INTO tblBike VALUES
  (101, 'City Classic', 0, 'S01', '2020-04-01'), (102, 'City Classic', 0, 'S01', '2020-04-01'),
  (103, 'E-Glide', 1, 'S03', '2021-06-15'), (104, 'E-Glide', 1, 'S05', '2021-06-15'),
  (105, 'Trail One', 0, 'S04', '2019-09-30'), (106, 'City Classic', 0, 'S02', '2022-03-10'),
  (107, 'E-Glide', 1, 'S06', '2022-03-10'), (108, 'E-Glide', 1, 'S01', '2023-05-02'),
  (109, 'Trail One', 0, 'S02', '2021-11-20'), (110, 'City Classic', 0, 'S05', '2023-05-02'),
  (111, 'E-Glide', 1, 'S03', '2024-01-08'), (112, 'Trail One', 0, 'S04', '2024-01-08');
INSERT INTO tblRide VALUES
  (5001, 101, 'S01', 'S03', '2024-05-03 08:05', 12, 150, 'member'),
  (5002, 103, 'S03', 'S05', '2024-05-03 08:20', 18, 320, 'casual'),
  (5003, 104, 'S05', 'S01', '2024-05-03 17:45', 22, 380, 'member'),
  (5004, 102, 'S01', 'S01', '2024-05-04 10:00', 35, 450, 'casual'),
  (5005, 105, 'S04', 'S02', '2024-05-04 11:30', 41, 520, 'casual'),
  (5006, 106, 'S02', 'S06', '2024-05-04 12:10', 9, 150, 'member'),
  (5007, 107, 'S06', 'S02', '2024-05-05 09:00', 14, 260, 'casual'),
  (5008, 108, 'S01', 'S05', '2024-05-06 07:55', 16, 290, 'member'),
  (5009, 101, 'S03', 'S01', '2024-05-06 18:05', 11, 150, 'member'),
  (5010, 104, 'S01', 'S04', '2024-05-07 08:15', 27, 410, 'member'),
  (5011, 109, 'S02', 'S02', '2024-05-07 13:00', 58, 690, 'casual'),
  (5012, 110, 'S05', 'S03', '2024-05-08 09:40', 20, 250, 'member'),
  (5013, 103, 'S05', 'S03', '2024-05-08 17:30', 19, 330, 'member'),
  (5014, 102, 'S01', 'S06', '2024-05-09 08:00', 24, 300, 'casual'),
  (5015, 111, 'S03', 'S01', '2024-05-10 12:20', 8, 200, 'casual'),
  (5016, 106, 'S06', 'S01', '2024-05-11 10:10', 31, 400, 'casual'),
  (5017, 104, 'S04', 'S06', '2024-05-11 15:00', 33, 480, 'casual'),
  (5018, 108, 'S05', 'S01', '2024-05-12 09:30', 15, 280, 'member'),
  (5019, 101, 'S01', 'S02', '2024-05-13 07:50', 13, 150, 'member'),
  (5020, 107, 'S02', 'S03', '2024-05-13 18:40', 26, 390, 'member'),
  (5021, 105, 'S02', 'S04', '2024-05-14 16:00', 44, 560, 'casual'),
  (5022, 110, 'S03', 'S05', '2024-05-15 08:30', 21, 260, 'member'),
  (5023, 103, 'S03', 'S03', '2024-05-15 12:00', 6, 180, 'casual'),
  (5024, 111, 'S01', 'S05', '2024-05-16 17:10', 17, 300, 'member'),
  (5025, 109, 'S06', 'S01', '2024-05-18 11:00', 29, 380, 'casual'),
  (5026, 102, 'S01', 'S03', '2024-05-19 14:20', 10, 150, 'member');
INSERT INTO tblService VALUES
  (101, '2024-02-10', 'brakes', 2500), (103, '2024-01-22', 'battery', 12000),
  (103, '2024-04-30', 'tyre', 1800), (104, '2024-03-14', 'battery', 11500),
  (105, '2023-12-01', 'chain', 1500), (105, '2024-04-02', 'brakes', 2600),
  (105, '2024-05-20', 'gears', 3200), (107, '2024-02-28', 'display', 6400),
  (109, '2024-03-03', 'tyre', 1700), (111, '2024-05-01', 'battery', 9900);
