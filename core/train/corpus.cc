// The embedded training corpus: English prose written for memprofd and
// placed in the public domain (CC0). About 23 KB, read as bytes
// (DataSpec::kEmbeddedCorpus); `make run` trains on it.

#include "absl/strings/string_view.h"
#include "core/train/data.h"

namespace memprofd {
namespace {

// Adjacent raw literals, one per piece, concatenated by the compiler.
constexpr char kCorpus[] =
    R"corpus(The Mill on the River

The town grew up where the river bends twice before it reaches the sea. Long before anyone
remembers, a miller built a wheel of oak at the second bend, where the water runs fast over a
shelf of grey stone, and the first houses gathered around the sound of that wheel the way
people gather around a fire. Farmers brought their grain in carts from the hills, and while
they waited for the flour they talked, traded, argued about the weather and the price of
salt, and sometimes stayed the night. In time there was an inn, then a smithy, then a small
church with a bell that had a crack in it, so that it rang a little flat on every feast day.

The miller's family kept the wheel for five generations. Each generation learned the same
lessons from the one before it. Listen to the wheel before you look at it, the old miller
used to say, because the ear will tell you that something is wrong long before the eye can
find it. A bearing that needs grease sings a higher note. A paddle that has cracked knocks
once on every turn. When the river is high in spring the wheel runs heavy and slow, and
when it is low at the end of summer it runs light and quick, and a good miller knows from
the sound alone how much grain he can grind before supper.

The children of the town were not allowed near the race, where the water was drawn off the
river and sent down a wooden channel to the wheel. Of course they went there anyway. They
dropped sticks into the channel and ran along the bank to see whose stick would reach the
wheel first, and they shouted when the paddles caught the sticks and carried them up and
over and down into the foam. The miller pretended not to see them. He had done the same
thing himself when he was small, and his father had pretended not to see him.

Change came slowly and then all at once. A road was built along the valley, and then a
railway, and the grain began to travel to a great mill in the city, where steam engines
turned rollers of steel day and night. The old wheel still turned, but it turned for fewer
and fewer farmers, and one winter the last miller's son went away to work in the city and
did not come back. For some years the wheel stood still. Moss grew on the paddles, and the
race filled with leaves.

It was the school teacher who saved it. She brought her pupils to the mill every autumn and
told them how the water pushed the paddles, how the paddles turned the shaft, how the shaft
turned the great stone, and how the stone, rolling round and round on its bed, broke each
grain of wheat into flour. The children asked questions that she could not answer, so she
wrote letters to the old miller's son in the city, and he wrote back, and after a few years
he came home to answer the questions himself. Together they cleared the race, replaced the
broken paddles, and on a cold bright morning in March they opened the sluice. The water
rushed down the channel, the wheel shivered, groaned, and began to turn. Half the town was
standing on the bank, and when the first flour came down the chute they cheered as if a
ship had come safely into harbour.

The mill grinds only a little grain now, for the bakery on the square and for visitors who
like to take home a bag of flour with a picture of the wheel printed on it. But the sound of
the wheel is back, and the children still drop sticks into the race, and the miller still
pretends not to see them.

How Bread Is Made

Bread begins with four things: flour, water, salt, and time. Yeast is often added, but even
yeast is only a way of borrowing time, since the wild yeasts that live in flour and in the
air will raise a dough if they are given a day or two to do their work. Everything else that
a baker adds, from butter and milk to seeds and honey, changes the character of the loaf,
but the loaf itself comes from those four simple things.

When flour meets water, two proteins in the wheat join together to form gluten, a web of
long elastic strands. Kneading stretches and folds that web until it is strong enough to
hold the gas that the yeast produces. A baker can feel the change under her hands. At first
the dough is rough and sticky and tears when it is pulled. After ten minutes of kneading it
becomes smooth and springy, and a small piece can be stretched so thin that light shines
through it without tearing. Bakers call this the window test, and it is the surest sign
that the dough is ready to rise.

While the dough rests, the yeast eats the sugars in the flour and breathes out carbon
dioxide and a little alcohol. The gas fills thousands of tiny pockets in the gluten web,
and the dough swells to twice its size. A cool, slow rise gives the best flavour, because
the yeast and the bacteria that live beside it have more time to make the acids and aromas
that we recognise as the taste of good bread. A warm, fast rise gives a loaf that is light
but plain.

Shaping the loaf is a small art of its own. The baker gently presses out the large bubbles,
folds the dough over itself to build tension on the surface, and rolls it into a round or a
long oval. The tight skin that forms on the outside will guide the way the loaf opens in the
oven. Just before baking, the baker cuts a shallow slash across the top with a sharp blade,
so that the loaf can expand in a controlled way instead of bursting at its weakest point.

In the oven the heat does three things at once. First it makes the gas in the dough expand
and the water turn to steam, so that the loaf rises quickly in the first minutes; bakers call
this the oven spring. Then it sets the gluten and the starch, fixing the shape of the crumb.
Finally it browns the crust, as sugars and proteins on the surface react together and create
hundreds of new compounds with a rich smell of nuts and caramel. A loaf is done when it is
deep brown and sounds hollow when it is tapped on the bottom.

The hardest part of making bread is the last step, which is to wait. A loaf that comes out
of the oven is still cooking inside, and if it is cut too soon the crumb will be gummy and
the steam will escape. Let it cool on a rack for an hour. Then cut a thick slice, spread it
with butter, and you will understand why people have been making bread in the same simple
way for thousands of years.
)corpus"
    R"corpus(
The Lighthouse Keeper

For thirty years Thomas Hale kept the light on the northern point, and in all that time it
never failed. He said this without pride, the way another man might say that he had never
missed a train. The light was his work, and the work was to keep it burning from sunset to
sunrise, every night of the year, whatever the weather and whatever his mood.

The tower stood on a ledge of black rock, with the sea on three sides and a narrow path on
the fourth that was covered by the tide twice a day. Below the lamp room there were four
small rooms stacked one above another: a store room full of oil and wicks and spare glass,
a kitchen with an iron stove, a bedroom with a narrow bed, and at the top, just beneath the
light, a tiny office where Thomas kept the log. Every night he wrote the same things in the
same order: the time he lit the lamp, the direction and strength of the wind, the state of
the sea, the ships that passed, and the time he put the lamp out in the morning.

People who visited the tower in summer often asked whether he was lonely. He would think
about the question for a while before he answered. There were lonely nights, he said, in
the long storms of winter, when no boat could reach the rock for weeks and the wind screamed
around the gallery and the whole tower trembled. But there was always work to do. The lens
had to be polished, the brass had to be cleaned, the clockwork that turned the light had to
be wound every few hours, and the windows of the lamp room had to be wiped free of salt
so that the beam could reach the ships far out at sea. A man who is busy, he said, has no
time to feel sorry for himself.

The lens was the heart of the light. It was made of hundreds of pieces of glass set in a
frame of brass, each piece ground to bend the light of the small flame into a single strong
beam. When the clockwork turned the lens, the beam swept across the water, and a sailor far
away saw a flash, then darkness, then another flash. Every lighthouse on the coast had its
own pattern of flashes, so that a captain who counted them could know exactly which light
he was looking at and where his ship must be. Thomas's light gave two quick flashes every
fifteen seconds. He could count the pattern in his sleep, and sometimes, his wife said, he
did.

Once, in a storm that the old people still talk about, a fishing boat lost its rudder and
drifted toward the rocks below the tower. Thomas saw its lantern through the rain, swinging
wildly as the boat rolled. He could not launch a boat of his own in such a sea, and there
was no one to send for help. So he did the only thing he could do. He kept the light
turning, and he hung a second lamp from the gallery on the side facing the rocks, so that
the fishermen could see where the danger lay. All night the boat fought its way along the
edge of the reef, and at dawn, when the wind dropped, it limped into the harbour with its
crew exhausted but alive. The fishermen came to the tower a week later with a basket of
fish and a bottle of rum. Thomas thanked them, put the rum in the store room, and wrote the
visit in the log, between the wind and the state of the sea.

When the light was finally made automatic, Thomas was offered a cottage in the village and a
small pension. He accepted both, but he walked out to the point every evening to watch the
light come on by itself. It came on at exactly the right time, every night, and he said that
this was a fine thing, and that he had no complaint about it at all. But he always waited
until he had seen the first two flashes before he turned around and walked home.

A Letter About Learning to Sail

Dear Anna,

You asked me how I learned to sail, and whether you should try it this summer. The short
answer is yes, you should, and the long answer is this letter, which I am writing at the
kitchen table while the rain taps on the window and the boat waits in the shed for spring.

I learned on a small wooden dinghy that belonged to my uncle. It leaked a little, and it had
a sail so patched and faded that you could not tell what colour it had been when it was new.
My uncle took me out on the lake on a calm morning and showed me three things. He showed me
how to hold the tiller, how to pull in the sail until it stopped shaking, and how to duck my
head when the boom swung across the boat. Then he stepped onto the jetty, pushed me off, and
told me to come back when I had learned something.

I learned a great deal that morning, most of it by making mistakes. I learned that a boat
cannot sail straight into the wind, and that you must zigzag toward a point upwind, turning
first one way and then the other. I learned that if you pull the sail in too tight the boat
leans over and slows down, and if you let it out too far the sail flaps and the boat stops.
I learned that the wind on a lake is never steady, and that a dark patch moving across the
water means a gust is coming, and that you should be ready for it before it arrives. Above
all, I learned that the boat is always telling you what it needs, if you are willing to
listen. The tiller pulls a little in your hand, the sail trembles along its front edge, the
water makes a different sound along the hull. All of these are messages.

When I came back to the jetty two hours later, cold and wet and very happy, my uncle asked
me what I had learned. I said that I had learned that sailing was mostly about paying
attention. He laughed and said that this was true of most things worth doing.

So my advice is simple. Find a small boat and a patient teacher. Go out on a calm day first.
Wear more clothes than you think you need, because it is always colder on the water. Do not
be afraid of capsizing; it happens to everyone, and the water will teach you more about
balance in one minute than a book can in a week. And when you come back to shore, write
down what the wind did and what you did, so that next time you will remember.

I hope you will come and visit when the weather is warmer. The boat is ready, or it will be
once I have fixed the leak, which is a job I have been promising to do for three years.

With love,
your aunt Margaret
)corpus"
    R"corpus(
On Clocks and the Measure of Time

For most of human history, time was something that people read from the sky. The sun rose
and set, the moon grew and shrank, the stars wheeled slowly overhead, and the seasons turned
in their long circle from planting to harvest and back again. A farmer did not need to know
that it was a quarter past ten. He needed to know whether there was enough light left to
finish the field, and whether the frost would come before the apples were picked.

The first clocks were made to help with prayer rather than with work. In the monasteries of
medieval Europe, monks were called to worship at fixed hours of the day and night, and a
bell had to be rung at the right moment even when clouds hid the sun. Water clocks and
candles marked with lines could measure the hours roughly, but they needed constant care.
Then, some time around the end of the thirteenth century, an unknown craftsman invented the
mechanical escapement, a device that lets a falling weight turn a wheel in small regular
steps instead of all at once. With the escapement the clock was born.

The early clocks were enormous, built of iron by blacksmiths, and they were not very
accurate. A good one might gain or lose a quarter of an hour in a day. They had no minute
hand, because no one would have trusted it. But they were loud, and they were public. Towns
put them in towers in the middle of the market square, where everyone could hear them
strike, and slowly the life of the town began to follow the clock instead of the sun. Shops
opened at a fixed hour. Meetings began when the bell rang. People started to speak of time
as something that could be saved, spent, and wasted.

The great leap in accuracy came with the pendulum. A pendulum of a given length swings with
almost exactly the same period whether it swings widely or narrowly, and a clock regulated
by a pendulum could keep time to within a few seconds a day. Suddenly the minute hand made
sense, and soon afterward the second hand did too. Scientists could time the swing of a
planet or the fall of a stone. Astronomers could compare their observations across
countries. Time was becoming a measurement, precise and shared.

At sea, the pendulum was useless, because the rolling of a ship upset its swing. This was a
serious problem, because a ship's navigator needed an accurate clock to find his position.
By measuring the height of the sun at noon he could tell how far north or south he was, but
to know how far east or west he had travelled he needed to know the time at his home port
at that same moment. Every hour of difference meant fifteen degrees of longitude. A clock
that drifted by a minute a day could put a ship dozens of miles off course after a long
voyage, and many ships were wrecked because of such errors. The answer, after decades of
patient work by a carpenter who taught himself to make clocks, was a sea clock driven by
springs and balanced wheels that could keep time through storms, heat, and cold.

Today the most accurate clocks count the vibrations of atoms, and they would not gain or lose
a second in many millions of years. Their signals are sent by radio and through networks to
the phones in our pockets, which set themselves without our asking. We live by a time that
is more precise than anything the monks could have imagined. And yet, on a summer evening,
when the light fades slowly over the fields and the first stars appear, most of us still
feel time the old way, as a turning rather than a counting.

A Morning at the Market

The market opens before the sun is up. By five o'clock the first vans are backing into the
square, their headlights sweeping across the wet stones, and the traders are unfolding their
tables and stretching canvas roofs over iron frames. There is a great deal of shouting, but
it is friendly shouting, the kind that people do when they have known each other for twenty
years and have no need to be polite.

The fruit seller is always first. He stacks his oranges in perfect pyramids, each one turned
so that its best side faces the street, and he sets the apples in rows by colour, from pale
green through yellow to deep red. Next to him the fish seller lays out her catch on a bed of
crushed ice: silver mackerel, flat grey sole, a heap of mussels, a single enormous crab that
she will not sell to anyone who cannot tell her how they plan to cook it. Across the aisle
the cheese man unwraps his wheels and wedges from their cloths, and the smell of them drifts
over the whole square.

The first customers are the cooks from the restaurants, who come early to get the best of
everything. They move quickly, pressing tomatoes and sniffing melons, and they bargain in a
kind of shorthand that outsiders cannot follow. Then come the old people of the
neighbourhood, who have time to talk and who would not dream of buying a lettuce without
first hearing how the grower's daughter is getting on at university. Later, when the sun is
high, the families arrive with children and dogs and shopping bags, and the market becomes
loud and slow and crowded.

There is a woman who sells only eggs. She has brown eggs, white eggs, blue eggs from a breed
of hen that came originally from South America, and tiny speckled quail eggs in boxes of a
dozen. She knows each of her hens by name, and she will tell you, if you ask, which of them
lays the most and which is the most bad tempered. Her stall is small and she never shouts,
but by noon she has always sold out.

By two o'clock it is over. The traders pack their tables into the vans, sweep the leaves and
paper into piles, and hose the fish scales off the stones. The pigeons come down to look for
crumbs. The square, which an hour ago was full of voices, is quiet again, and the only sign
that the market was there at all is the smell of oranges that lingers in the air until the
evening.
)corpus"
    R"corpus(
A Garden in Winter

People who do not garden imagine that a garden sleeps in winter. It does not sleep; it
waits, which is a different thing. Under the frozen surface the roots of the trees are still
growing whenever the soil is a little warmer than the air. The bulbs that were planted in
autumn are sending down roots and preparing their leaves in the dark. Earthworms are pulling
the fallen leaves into their burrows, and in the compost heap a slow warmth goes on working,
turning last summer's stalks and peelings into the dark crumbly soil of next year.

Winter is the season when the shape of a garden can be seen. In summer everything is hidden
under leaves and flowers, and the eye is drawn to colour. In winter the colour is gone, and
what remains is structure: the line of a hedge, the curve of a path, the dark mass of an
evergreen against a pale sky, the bare branches of an old apple tree twisted into shapes that
no one would have planned. A good garden looks as fine in January as it does in June,
because its bones are good.

This is also the season for the work that cannot be done at any other time. Fruit trees are
pruned while they are bare, so that the gardener can see every branch and decide which to
keep. The aim is to open the tree to light and air, to remove branches that cross or rub
against each other, and to leave a shape that will carry fruit without breaking. An old
gardener once told me that you should be able to throw a hat through the middle of a well
pruned apple tree. I have never tried it, but I think of it every winter when I pick up the
saw.

Winter is when seeds are ordered, too, and that is one of the great pleasures of the year.
On a dark evening, with the catalogues spread across the table, every gardener is an
optimist. This year the beans will not be eaten by slugs. This year the carrots will come up
straight. This year there will be a whole bed of sweet peas, and the smell of them will fill
the house all through July. The list grows longer than the garden could possibly hold, and
then it is cut back, and then it grows again.

On the coldest mornings the garden has a beauty that lasts only an hour or two. Frost covers
every leaf and twig with a white fur of ice crystals, the spider webs in the hedge hang like
strings of glass beads, and the low sun turns the whole scene gold and pink. The birds come
to the feeder in crowds: sparrows quarrelling, a robin watching from the fence, a pair of
blue tits hanging upside down from the peanuts. Then the sun climbs, the frost melts, and the
garden is brown and wet and ordinary again. But the gardener who went out early has seen it,
and will carry the picture through the rest of the day.

Advice to a Young Engineer

When you build something that other people depend on, the first thing to remember is that it
will be used in ways you did not expect. Someone will give it input that you never imagined,
at a time when you are asleep, and the question will not be whether it fails but how. A
system that fails clearly, with a message that says what went wrong and what to do about it,
is a friend. A system that fails silently, or that goes on running with bad data, is a trap
that will catch someone later, often you.

Measure before you change. It is very easy to believe that you know where the time goes or
where the memory goes, and very often the belief is wrong. Write down what you expect, then
measure, then compare. The difference between the two is where the learning happens. Keep
the measurements, too, because next month you will want to know whether things got better
or worse, and memory is a poor record.

Write tests that can fail. A test that always passes tells you nothing. Before you trust a
test, break the code on purpose and watch the test catch it. Then fix the code and watch the
test pass. This takes a few minutes and saves days.

Make small changes and keep them working. A large change that is almost finished is worth
less than a small change that is finished, because the small change can be used, tested, and
built upon, while the large one sits on your machine and grows stale. When you are stuck,
make the problem smaller until it is easy, solve that, and then grow it again.

Read the code of people you admire, and read the code of people you disagree with. Notice
how the best code explains itself: names that say what things are, functions that do one
thing, comments that say why rather than what. Notice how much of good engineering is
simply care, taken consistently, over a long time.

Finally, be kind to the people who will come after you. Leave notes. Explain the strange
decisions. Clean up the things you broke. Someday you will be the one who opens an old
project late at night, trying to understand why it does what it does, and you will be
grateful to whoever took the time to write it down.
)corpus";

}  // namespace

absl::string_view EmbeddedCorpus() {
  return absl::string_view(kCorpus, sizeof(kCorpus) - 1);
}

}  // namespace memprofd
