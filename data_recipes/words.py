"""Word material shared by the string recipes and the world: a built-in English word list and a seeded generator
of pronounceable pseudo-words ("habayp", "troamoung") built from syllables.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

# Common lower-case English words, 3-10 letters, letters only.
WORDS: tuple[str, ...] = tuple(
    """
able acid aged also area army away baby back ball band bank base bath bear beat been beer bell belt best bird
blow blue boat body bone book boot born boss both bowl bulk burn bush busy cake call calm camp card care case
cash cast cell chat chip city club coal coat code cold come cook cool cope copy core corn cost crew crop dark
data date dawn dead deal dear debt deep deny desk diet dirt dish door dose down draw drop drug dust duty each
earn ease east easy edge else even ever exit face fact fail fair fall farm fast fear feel file fill film find
fine fire firm fish five flag flat flow food foot form fort four free frog fuel full fund gain game gate gift
girl give glad goal gold golf good grey grow hair half hall hand hang hard harm hate head hear heat held hell
help here hero high hill hire hold hole holy home hope host hour huge hung hunt hurt idea inch iron item jazz
join joke jump jury just keen keep kick kind king kiss knee knew know lack lady lake lamp land lane last late
lead leaf lean left lens less life lift like line link lion list live load loan lock long look lord lose loss
loud love luck lung made mail main make male mall many mark mass meal mean meat meet menu mere mile milk mind
mine miss mode mood moon more most move much must name navy near neck need news next nice nine none nose note
okay once only open oven pack page paid pain pair palm park part pass past path peak pick pile pine pink pipe
plan play plot plus poem poet pole poll pool poor port pose post pour pray pull pump pure push race rain rank
rare rate read real rear rely rent rest rice rich ride ring rise risk road rock role roll roof room root rope
rose rule rush safe sail salt same sand save seat seed seek seem self sell send ship shoe shop shot show shut
sick side sign silk sing sink site size skin slip slow snow soap sock soft soil sold sole song soon sort soul
soup spin spot star stay step stop such suit sure swim tail take tale talk tall tank tape task team tear tell
tend tent term test text than that then they thin this tide tidy till time tiny tone tool tour town tree trip
true tube tune turn twin type unit upon used user vary vast very view vote wage wait wake walk wall want warm
wash wave weak wear week well west what when whom wide wife wild will wind wine wing wire wise wish wolf wood
wool word work yard yarn year yell zero zone
ant ape arm art bag bat bed bee box boy bus cap car cat cow cup dog ear egg elf eye fan fig fox gem hat hen
ink jam jar jet key kid leg lid lip map mat mud net nut oak owl pan pen pet pig pin pot rat rug sea sky sun
tea toe toy van web wig yak
about above actor adult after agent album alarm alert alike alive angle angry apple arena arrow aside audio
badge baker basic beach berry birth black blade blank blind block bloom board bonus brain brand bread brick
bride brief broad brown brush cabin cable camel candy cargo chain chair chalk charm chart cheek chess chest
chief child chord civil claim class clean clerk clock cloud coach coast coral couch count cover craft crane
crowd crown curve cycle daily dance delta diary dream dress drink drive eagle earth elbow empty enemy entry
equal event exact extra faith fence field flame flash fleet floor flour fluid focus force frame fresh front
frost fruit ghost giant glass globe glove grain grape grass green guard guest guide habit happy heart honey
horse hotel house human humor image index input ivory jelly jewel juice knife label laser lemon level light
limit linen lodge lunar lunch magic major maple march match mayor medal metal model money month motor mouse
mouth music nerve night noble noise north novel nurse ocean olive onion opera orbit order organ otter owner
paint panel paper party pasta peace pearl pedal phone photo piano pilot pitch pizza place plane plant plate
point pound power press price pride prize proof quiet radio raven river robin robot rough round royal ruler
salad sauce scale scene scout screw shade shape share sheep shelf shell shirt shore sight skill skirt slate
sleep smile smoke snake solar sound south space spade spark spice spine spoon sport staff stage stamp steam
steel stick stone storm story stove sugar sweet swing table taste teeth theme thumb tiger toast tooth torch
tower track trade trail train treat trend trial truck trunk tulip uncle union upper urban valley value video
visit voice wagon waste watch water whale wheat wheel white woman world yacht young zebra
almond anchor animal answer arctic autumn ballet banana barrel basket beacon border bottle branch bridge
bucket butter button camera candle canvas carpet castle cattle cellar cherry circle climate coffee collar
copper cotton cousin credit dancer danger desert dinner doctor dollar donkey dragon drawer effort empire
engine escape fabric family farmer father finger flight flower forest fossil friend garden garlic ginger
glider gravel guitar hammer harbor helmet hollow island jacket jungle kettle kitten ladder leader letter
lizard locket marble market meadow mirror monkey mother museum needle number orange oyster packet palace
parcel parrot pebble pencil pepper planet pocket potato puzzle rabbit ribbon rocket saddle salmon silver
singer sister spider spring square statue stream street summer sunset tablet temple tennis thread ticket
timber tomato turtle velvet violin walnut window winter wizard yellow
balance battery bicycle blanket cabbage captain central chicken cluster compass concert cottage crystal
curtain diamond dolphin eclipse elephant feather fortune gallery harvest history horizon journey kitchen
lantern library machine mansion meadows message mineral morning mustard network octopus orchard package
painter panther peacock pelican penguin pilgrim pyramid rainbow sandals scholar seaweed shelter soldier
station stomach student sunrise teacher thunder tornado traffic trumpet uniform village volcano weather
whistle
avalanche butterfly carpenter chocolate crocodile dandelion dinosaur envelope fireplace flamingo
hurricane jellyfish kangaroo landscape lemonade mountain notebook ornament pineapple porcupine sandwich
scarecrow squirrel strawberry submarine telescope triangle umbrella vegetable waterfall
""".split()
)

ONSETS = (
    "",
    "b",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "dr",
    "tr",
    "gr",
    "kr",
    "pl",
    "bl",
    "fl",
    "st",
    "sh",
    "ch",
    "th",
)
VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ay", "ee", "oo", "oa", "ou", "ea")
CODAS = ("", "", "", "", "n", "m", "ng", "p", "t", "k", "s", "r", "l", "nd", "mp")


def syllable(rng: random.Random, final: bool) -> str:
    # Codas only end words: "ha-bayp" reads well, "hap-bayp" piles up consonants.
    return rng.choice(ONSETS) + rng.choice(VOWELS) + (rng.choice(CODAS) if final else "")


def pseudo_word(rng: random.Random, min_syllables: int = 2, max_syllables: int = 3) -> str:
    """One pronounceable pseudo-word of ``min_syllables``..``max_syllables`` syllables."""
    n = rng.randint(min_syllables, max_syllables)
    return "".join(syllable(rng, final=i == n - 1) for i in range(n))


def unique(rng: random.Random, make, n: int, exclude: Iterable[str] = (), what: str = "pseudo-words") -> list[str]:
    """``n`` distinct outputs of ``make(rng)`` (in generation order, so deterministic), none in ``exclude``."""
    seen = set(exclude)
    out: list[str] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"could only make {len(out)} distinct {what} of the {n} asked for; widen the settings")
        word = make(rng)
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


def pseudo_words(
    rng: random.Random, n: int, min_syllables: int = 2, max_syllables: int = 3, exclude: Iterable[str] = ()
) -> list[str]:
    """``n`` distinct pseudo-words, none equal to a real word from :data:`WORDS` or to ``exclude``."""
    return unique(rng, lambda r: pseudo_word(r, min_syllables, max_syllables), n, (*WORDS, *exclude))
